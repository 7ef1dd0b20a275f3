"""`switchyard up` / `status` / `down` on real Ray: a local head of its own, and attached to the
session's cluster. `down` must stop exactly what `up` started."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from subprocess import PIPE
from typing import Any

import pytest

from switchyard.cluster.head import short_temp_dir
from switchyard.cluster.record import write_record
from switchyard.policy.keys import KeyStore
from tests.platform.test_stale_records import gone_pid, platform_record

pytestmark = pytest.mark.ray


def switchyard(*args: str, check: bool = True, timeout: float = 400) -> subprocess.CompletedProcess[str]:
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "switchyard.cli", *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            env={**platform_env(), "RAY_ADDRESS": ""},
        )
    except subprocess.TimeoutExpired as exc:  # what it said before it hung, and what the cluster had
        raise AssertionError(
            f"switchyard {' '.join(args)} ran past {timeout:.0f}s\n{exc.stdout!r}\n{exc.stderr!r}\n{cluster_state()}"
        ) from exc
    if check and proc.returncode != 0:
        raise AssertionError(f"switchyard {' '.join(args)} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


# The session cluster's HAProxy listener ports (tests/conftest.py): a platform this test starts
# picks its own, as on a developer's machine, or the two would share them.
SESSION_ONLY_ENV = ("RAY_SERVE_HAPROXY_STATS_PORT", "RAY_SERVE_HAPROXY_METRICS_PORT")


def platform_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SESSION_ONLY_ENV}


def as_json(proc: subprocess.CompletedProcess[str]) -> Any:
    return json.loads(proc.stdout)


def cluster_state() -> str:
    """Serve's view and each node's free resources, if this process is connected to Ray."""
    import ray

    if not ray.is_initialized():
        return "(not connected to Ray)"
    from ray import serve

    try:
        applications = str(serve.status())
    except Exception as exc:  # noqa: BLE001 - a diagnostic: say why there is none
        applications = f"(no Serve status: {exc!r})"
    nodes = {n["NodeID"][:8]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    return f"serve: {applications}\nnodes: {nodes}\navailable: {ray.available_resources()}"


def undeploy_attached(state: Path) -> None:
    """What `down` does for a platform attached to the session's cluster, from this process."""
    from switchyard.cluster.deploy import undeploy
    from switchyard.paths import policies_dir

    undeploy(shutdown_serve=False, policies_dir=policies_dir(None), state_dir=state)


def started_pid(state: str) -> int:
    return int(json.loads((Path(state) / "up.json").read_text())["supervisor_pid"])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.own_cluster
@contextmanager
def suspended_dashboard(state: Path) -> Iterator[None]:
    """Stop the Ray dashboard of the platform on `state` (SIGSTOP) for the block."""
    import psutil

    temp_dir = f"--temp-dir={short_temp_dir(state.resolve())}/"
    [dashboard] = [
        p
        for p in psutil.process_iter(["cmdline"])
        if any(a.endswith("dashboard/dashboard.py") for a in p.info["cmdline"] or ())
        and any(a.startswith(temp_dir) for a in p.info["cmdline"])
    ]
    dashboard.suspend()
    try:
        yield
    finally:
        dashboard.resume()


def test_local_platform_up_status_down(tmp_path: Path) -> None:
    state = str(tmp_path / "state")
    # A platform that crashed (or whose machine restarted) left its record: `up` clears it and
    # starts. Two `up`s at once (two terminals, a retrying script) used to run two clusters on
    # one state dir, the record naming one: exactly one starts, the other names it.
    Path(state).mkdir()
    write_record(Path(state), platform_record(Path(state), gone_pid()))
    command = [sys.executable, "-m", "switchyard.cli", "up", "--demo", "--detach", "--gpus", "8", "--state-dir", state]
    env = {**platform_env(), "RAY_ADDRESS": ""}
    both = [subprocess.Popen([*command, "--json"], stdout=PIPE, stderr=PIPE, text=True, env=env) for _ in range(2)]
    said = [p.communicate(timeout=400) for p in both]
    codes = [p.returncode for p in both]
    record = json.loads((Path(state) / "up.json").read_text()) if (Path(state) / "up.json").exists() else {}
    supervisor = record.get("supervisor_pid")
    try:  # whatever fails below, a platform that started is stopped: the next tests share the machine
        assert sorted(codes) in ([0, 1], [0, 2]), f"{codes}: {said}"
        started, refused = said[codes.index(0)], said[1 - codes.index(0)]
        assert any("clearing the record of a platform that is not running: its supervisor (PID" in e for _, e in said)
        where = Path(state).resolve()
        taken = f"another switchyard supervisor (PID {started_pid(state)}) already serves state dir {where}"
        assert taken in refused[1] or "a platform is already up" in refused[1], refused
        assert "Traceback" not in refused[1]
        up = json.loads(started[0])
        assert up["demo_api_key"].startswith("sy_") and up["gateway_url"].startswith("http://127.0.0.1:")
        # A second `up` on the same state dir refuses instead of starting a second cluster.
        again = switchyard("up", "--detach", "--state-dir", state, check=False)
        assert again.returncode != 0 and "already up" in again.stderr
        # A copy of the record in another state dir names this platform's supervisor: its `down`
        # must leave the platform running (the status checks below see it up) and clear the copy.
        copy = tmp_path / "copy"
        copy.mkdir()
        shutil.copy(Path(state) / "up.json", copy / "up.json")
        stale = switchyard("down", "--state-dir", str(copy), check=False)
        assert stale.returncode == 1 and f"(state dir {Path(state).resolve()})" in stale.stderr, stale.stderr
        assert pid_alive(supervisor) and not (copy / "up.json").exists()

        status = as_json(switchyard("status", "--state-dir", state, "--json"))
        assert status["gpus"]["total"] == 8
        assert status["gpus"]["serve"] + status["gpus"]["train"] + status["gpus"]["free"] == 8
        assert status["serve"]["gateway"]["status"] == "RUNNING"
        assert "error" not in status["scheduler"] and status["scheduler"]["total_gpus"] == 8
        assert status["gateway"]["ok"] is True and status["gateway"]["policy"]["last_error"] is None
        # Every gateway replica serves the set the head published, and status shows which.
        published = status["policy"]["published"]
        assert status["gateway"]["policy"]["fingerprint"] == published
        assert [r["fingerprint"] for r in status["policy"]["replicas"]] == [published]
        shown = switchyard("status", "--state-dir", state).stdout
        assert "Policy set served by each gateway replica" in shown and published[:12] in shown
        # An admin.key that is not UTF-8 is named, not a traceback (found from a fresh shell, stop 46).
        key_file = Path(state) / "admin.key"
        good_key = key_file.read_bytes()
        key_file.write_bytes(b"\xff\xfe")
        damaged = switchyard("status", "--state-dir", state, check=False)
        key_file.write_bytes(good_key)
        assert damaged.returncode == 3 and "admin.key holds no key" in damaged.stderr, damaged.stderr
        assert "Traceback" not in damaged.stderr, damaged.stderr
        # Live fairness per team, by the simulator's definitions (issue 19).
        fairness = status["scheduler"]["fairness"]
        assert fairness["teams"] and fairness["inversion_bound_s"] == 300.0
        assert "fair share (received / fair GPU-s" in shown
        # A hung dashboard (stopped: its port accepts, nothing answers) is what an operator runs
        # `status` about. It used to wait out the state API's 30 s and print a traceback (stop 49).
        with suspended_dashboard(Path(state)):
            started = time.monotonic()
            hung = switchyard("status", "--state-dir", state, "--json", check=False)
            took = time.monotonic() - started
        assert hung.returncode == 0 and "Traceback" not in hung.stderr, hung.stderr
        division = as_json(hung)["gpus"]
        assert division["serve"] is None and "the Ray dashboard did not answer" in division["error"], division
        assert as_json(hung)["scheduler"]["total_gpus"] == 8 and took < 28, took

        # The demo key is a real key: its hash is in the state dir, the key itself is not.
        assert up["demo_api_key"].split("_", 2)[2].encode() not in (Path(state) / "keys.db").read_bytes()
    finally:
        if record:
            switchyard("down", "--state-dir", state)
    assert not (Path(state) / "up.json").exists()
    assert supervisor is not None and not pid_alive(supervisor)
    leftovers = subprocess.run(["pgrep", "-f", record["ray_temp_dir"]], capture_output=True, text=True).stdout.split()
    assert leftovers == [], f"processes of the stopped cluster remain: {leftovers}"
    assert "nothing to stop" in switchyard("down", "--state-dir", state, check=False).stderr


@pytest.mark.own_cluster
def test_a_local_head_too_small_for_the_gateway_fails_naming_it(tmp_path: Path) -> None:
    """One CPU cannot hold the gateway's replica (1 CPU) beside the local model's (0.5): the
    head gives up after --timeout, shuts its Ray down, and `up` shows why in a few lines."""
    state = tmp_path / "state"
    up = switchyard(
        "up", "--cpus", "1", "--timeout", "5", "--detach", "--state-dir", str(state), check=False, timeout=240
    )
    assert up.returncode == 1, f"{up.stdout}\n{up.stderr}"
    error = up.stderr.removeprefix("switchyard: error: ").splitlines()
    assert error[0] == "the Serve application 'gateway' was not running within 5s (status DEPLOYING)", up.stderr
    assert any(line.startswith("  deployment 'gateway' (UPDATING): 0 replica(s) running") for line in error)
    assert any("each replica needs CPU 1" in line for line in error), up.stderr
    assert error[-1] == f"(the head's whole log: {state / 'logs' / 'head.log'})"
    assert len(error) <= 8 and "Traceback" not in up.stderr, up.stderr
    assert not (state / "up.json").exists()
    from switchyard.cluster.head import short_temp_dir

    deadline = time.monotonic() + 15  # Ray's processes exit as the head shuts it down; the OS reaps them after
    for mark in (str(state), str(short_temp_dir(state))):  # the head's command line, its Ray's temp dir
        while left := subprocess.run(["pgrep", "-f", mark], capture_output=True, text=True).stdout.split():
            assert time.monotonic() < deadline, f"processes of the failed head remain: {left}"
            time.sleep(0.5)


def test_attach_to_existing_cluster(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    import ray

    from switchyard.ports import listener_port

    state = str(tmp_path / "state")
    ledgers_before = alive_ledgers()
    try:  # `up` inside: one that fails half-way must not leave its actors on the shared cluster
        up = as_json(
            switchyard(
                "up",
                "--address",
                ray_cluster["gcs_address"],
                "--gateway-port",
                str(listener_port()),
                "--detach",
                "--state-dir",
                state,
                "--json",
            )
        )
        assert up["owns_cluster"] is False
        assert ray.get_actor("switchyard-scheduler", namespace="switchyard") is not None
        status = as_json(switchyard("status", "--state-dir", state, "--json"))
        assert "gateway" in status["serve"] and status["gpus"]["total"] == 16
        groups = {n["node_group"] for n in status["nodes"] if n["gpus"]}
        assert groups == {"a", "b"}
        assert_a_second_platform_leaves_the_first_alone(ray_cluster["gcs_address"], Path(state), tmp_path / "other")
    finally:
        down = switchyard("down", "--state-dir", state, check=False)
        if down.returncode != 0:  # `up` failed before recording the platform: undo it here
            undeploy_attached(Path(state))
    with pytest.raises(ValueError):
        ray.get_actor("switchyard-scheduler", namespace="switchyard")
    # The gateway's replicas created the platform's ledger actor (detached): down stops it too.
    assert alive_ledgers() == ledgers_before
    assert ray.is_initialized()  # down left the cluster itself alone


def assert_a_second_platform_leaves_the_first_alone(address: str, first: Path, second: Path) -> None:
    """A cluster has one scheduler, a named actor: a second platform attached to it used to
    reuse the first one's scheduler (its policies, its state), replace its Serve apps, and stop
    both with its own `down`. Now its `up` is refused before it touches the cluster, and a
    `down` from a stale record of another platform leaves the running one alone."""
    import ray
    from ray import serve

    scheduler = ray.get_actor("switchyard-scheduler", namespace="switchyard")
    incarnation = ray.get(scheduler.ping.remote(), timeout=60)

    def first_platform() -> tuple[float, str, dict[str, float]]:
        """The scheduler's incarnation and owner, and when each Serve app was last deployed."""
        apps = {name: app.last_deployed_time_s for name, app in serve.status().applications.items()}
        return ray.get(scheduler.ping.remote(), timeout=60), ray.get(scheduler.state_dir.remote(), timeout=60), apps

    before = first_platform()
    assert before[1] == str(first.resolve()) and {"gateway", "console"} <= before[2].keys(), before
    up = attach_and_fail(address, second, "60")
    assert up.returncode == 1, f"{up.stdout}\n{up.stderr}"
    told = f"refusing to attach: this cluster already runs a switchyard platform (state dir {first.resolve()})"
    assert told in up.stderr, up.stderr
    assert f"switchyard down --state-dir {first.resolve()}" in up.stderr and "Traceback" not in up.stderr, up.stderr
    assert not (second / "up.json").exists()
    assert first_platform() == before
    # An operator's stale record: a platform that once ran on this cluster from `second`.
    record = json.loads((first / "up.json").read_text())
    (second / "up.json").write_text(json.dumps({**record, "state_dir": str(second.resolve())}))
    down = switchyard("down", "--state-dir", str(second), check=False)
    assert down.returncode == 1, f"{down.stdout}\n{down.stderr}"
    assert f"another platform's (state dir {first.resolve()}), so switchyard left them alone" in down.stderr
    assert not (second / "up.json").exists() and "Traceback" not in down.stderr, down.stderr
    assert first_platform() == before
    # A verbatim copy of the first's record (it names the first's state dir) in another state
    # dir: `status` of the copy shows no platform rather than the first, and its `down` used to
    # take the first's apps and scheduler off.
    copy = second.parent / "copy"
    copy.mkdir()
    shutil.copy(first / "up.json", copy / "up.json")
    shown = switchyard("status", "--state-dir", str(copy), check=False)
    assert shown.returncode == 2 and shown.stdout == "", f"{shown.stdout}\n{shown.stderr}"
    assert f"runs another platform now (state dir {first.resolve()};" in shown.stderr, shown.stderr
    down = switchyard("down", "--state-dir", str(copy), check=False)
    assert down.returncode == 1, f"{down.stdout}\n{down.stderr}"
    assert f"another platform's (state dir {first.resolve()}), so switchyard left them alone" in down.stderr
    assert first_platform() == before
    assert incarnation == before[0]


def test_attach_to_a_cluster_whose_serve_runs_an_app_named_like_the_platforms_is_refused(
    ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """A team's own Serve app named `console` runs on the cluster and no platform does: `up
    --address` would have replaced it with the platform's console. It is refused, naming the
    app, and the team's app keeps running."""
    import ray
    from ray import serve

    @serve.deployment(num_replicas=1, ray_actor_options={"num_cpus": 0})
    class TeamConsole:
        def __call__(self, request: Any) -> str:
            return "the team's own console"

    serve.run(TeamConsole.bind(), name="console", route_prefix="/team-console")  # type: ignore[attr-defined]
    state = tmp_path / "state"
    try:
        deployed = serve.status().applications["console"].last_deployed_time_s
        up = attach_and_fail(ray_cluster["gcs_address"], state, "60", "--demo")
        assert up.returncode == 1, f"{up.stdout}\n{up.stderr}"
        assert "refusing to attach: this cluster's Serve already runs applications named 'console'" in up.stderr
        assert "Traceback" not in up.stderr, up.stderr
        # `--demo` created the demo team's key before the refusal, and never showed it: it is
        # revoked, not left a live key nobody holds (found in stop 43).
        with KeyStore.in_state_dir(state) as keys:
            assert keys.list(team="demo") == [], keys.list(team="demo", include_revoked=True)
        app = serve.status().applications["console"]
        assert (getattr(app.status, "value", app.status), app.last_deployed_time_s) == ("RUNNING", deployed)
        with pytest.raises(ValueError):
            ray.get_actor("switchyard-scheduler", namespace="switchyard")
        assert not (state / "up.json").exists()
    finally:
        if switchyard("down", "--state-dir", str(state), check=False).returncode != 0:
            undeploy_attached(state)  # `up` got further than it should have: take its parts off
        serve.delete("console")


def alive_ledgers() -> set[str]:
    """The names of the ledger actors alive on the session's cluster (earlier tests leave theirs)."""
    from ray.util.state import list_actors

    rows = list_actors(filters=[("class_name", "=", "LedgerActor"), ("state", "=", "ALIVE")], limit=10_000)
    return {row.name for row in rows}


def test_the_platforms_head_actors_leave_the_heads_cpus_free(
    ray_cluster: dict[str, Any], repo: Path, tmp_path: Path
) -> None:
    """The ledger pinned itself to the head with a custom resource and no `num_cpus`, so Ray
    held one of the head's CPUs for its whole life. Two ledgers left by earlier platforms and a
    gateway replica filled the session head's 4 CPUs, and `up --address` timed out waiting for
    the console's replica (CPU 0.1 on the head) while the cluster as a whole had 7.5 CPUs free."""
    import ray
    from ray.util.state import list_actors

    from switchyard.cluster.app_readiness import head_room
    from switchyard.cluster.ledger import ledger_actor
    from switchyard.cluster.policy_publisher import policy_publisher
    from switchyard.db.engine import SQLITE_PREFIX

    (tmp_path / "state").mkdir()
    ledger = ledger_actor(SQLITE_PREFIX + str(tmp_path / "ledger.db"), name="head-cpu-ledger", detached=False)
    publisher = policy_publisher(repo / "policies", tmp_path / "state")
    try:
        ray.get([ledger.health.remote(), publisher.status.remote()], timeout=120)
        for actor in (ledger, publisher):
            (row,) = list_actors(filters=[("actor_id", "=", actor._actor_id.hex())], detail=True)
            assert row.required_resources.get("CPU", 0) == 0, (row.class_name, row.required_resources)
            assert row.required_resources.get("node:__internal_head__", 0) > 0, (row.class_name, row.required_resources)
        # What `up`'s error says of the head when a replica pinned there cannot start.
        room = head_room()
        assert room is not None and room.free.get("node:__internal_head__", 0) > 0, room
        assert room.cpu_holders.get("LedgerActor") == 0 and "PolicyPublisher" in room.cpu_holders, room
    finally:
        for actor in (ledger, publisher):
            ray.kill(actor, no_restart=True)


def attach_and_fail(address: str, state: Path, timeout: str, *more: str) -> subprocess.CompletedProcess[str]:
    """`up --address` in its own process, expected to fail (its exit code is the caller's to check)."""
    from switchyard.ports import listener_port

    args = ("--gateway-port", str(listener_port()), "--timeout", timeout, "--detach", "--state-dir", str(state))
    return switchyard("up", "--address", address, *args, *more, check=False, timeout=240)


def test_attach_to_a_cluster_without_room_fails_naming_the_stuck_deployment(
    ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """Every CPU of the cluster is taken, so the gateway's replica (1 CPU) cannot be placed:
    `up --address` gives up after --timeout, says which deployment is stuck and what it needs,
    and takes off what it started. Before, `serve.run` waited for the replica without bound."""
    import ray
    from ray import serve
    from ray._private.state import available_resources_per_node  # per node: the public API sums them
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=0)
    class CpuHog:
        def ready(self) -> bool:
            return True

    hogs = [
        CpuHog.options(  # type: ignore[attr-defined]
            num_cpus=free["CPU"], scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False)
        ).remote()
        for node, free in available_resources_per_node().items()
        if free.get("CPU", 0) > 0
    ]
    state = str(tmp_path / "state")
    try:
        ray.get([h.ready.remote() for h in hogs], timeout=60)
        assert ray.available_resources().get("CPU", 0) == 0, cluster_state()
        up = attach_and_fail(ray_cluster["gcs_address"], Path(state), "20")
        assert up.returncode == 1, f"{up.stdout}\n{up.stderr}"
        assert "the Serve application 'gateway' was not running within 20s" in up.stderr, up.stderr
        assert "deployment 'gateway' (UPDATING): 0 replica(s) running" in up.stderr, up.stderr
        assert "each replica needs CPU 1" in up.stderr, up.stderr
        assert "free on the cluster now: CPU 0," in up.stderr, up.stderr
        assert "took off what it had started" in up.stderr and "Traceback" not in up.stderr
        # Nothing of it is left on the cluster, and no platform is recorded.
        with pytest.raises(ValueError):
            ray.get_actor("switchyard-scheduler", namespace="switchyard")
        assert "gateway" not in serve.status().applications
        assert not (Path(state) / "up.json").exists()
    finally:
        for hog in hogs:
            ray.kill(hog)
        if switchyard("down", "--state-dir", state, check=False).returncode != 0:
            undeploy_attached(Path(state))


def test_attach_with_a_corrupt_scheduler_log_fails_naming_the_file(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    """The scheduler's write-ahead log on the head is corrupt, so its actor's constructor raises:
    `up --address` says at once that the scheduler failed to start and names the file and line,
    takes off what it started and exits 1. Before, the client's retries ran a minute and then
    printed a Ray traceback."""
    import ray
    from ray import serve

    state = tmp_path / "state"
    wal = state / "scheduler-wal" / "wal-000000000001.jsonl"
    wal.parent.mkdir(parents=True)
    wal.write_text('not json\n{"seq": 2}\n')
    started = time.monotonic()
    up = attach_and_fail(ray_cluster["gcs_address"], state, "60")
    took = time.monotonic() - started
    assert up.returncode == 1, f"{up.stdout}\n{up.stderr}"
    assert "the scheduler failed to start: " in up.stderr, up.stderr
    assert f"WalCorruptError: {wal}:1: not a write-ahead-log record" in up.stderr, up.stderr
    assert "took off what it had started" in up.stderr and "Traceback" not in up.stderr, up.stderr
    assert took < 60, f"it waited out its deadline ({took:.0f}s) instead of reporting the constructor's error"
    with pytest.raises(ValueError):
        ray.get_actor("switchyard-scheduler", namespace="switchyard")
    assert "gateway" not in serve.status().applications
    assert not (state / "up.json").exists()
    assert wal.read_text() == 'not json\n{"seq": 2}\n'  # the log is left as it was, for the operator


def test_waiting_for_an_actor_names_its_constructors_error_or_the_deadline(ray_cluster: dict[str, Any]) -> None:
    """`wait_for_actor`: a constructor's error ends the wait at once with its type and message;
    an actor that never answers is named with the deadline it missed."""
    import ray

    from switchyard.cluster.actor_readiness import wait_for_actor
    from switchyard.cluster.app_readiness import PlatformNotRunning

    @ray.remote(num_cpus=0, max_restarts=-1)
    class Broken:
        def __init__(self, path: str) -> None:
            raise ValueError(f"{path}: cannot be read")

        def ping(self) -> bool:
            return True

    @ray.remote(num_cpus=0)
    class Slow:
        def ping(self) -> bool:
            time.sleep(30)
            return True

    broken = Broken.remote("/state/x.db")  # type: ignore[attr-defined]
    started = time.monotonic()
    with pytest.raises(PlatformNotRunning) as failed:
        wait_for_actor("broken thing", broken.ping.remote, 30)
    assert str(failed.value) == "the broken thing failed to start: ValueError: /state/x.db: cannot be read"
    assert time.monotonic() - started < 20
    slow = Slow.remote()  # type: ignore[attr-defined]
    with pytest.raises(PlatformNotRunning, match=r"^the slow thing did not answer within 2s$"):
        wait_for_actor("slow thing", slow.ping.remote, 2)
    ray.kill(slow)
