"""A platform record (`up.json`) that no longer describes a running platform: a crashed or
rebooted platform's, whose PID may now be another process's, a copy of another state dir's, or an
attached platform's whose cluster is gone. Each command says so at once and stops nothing else:
`down` used to SIGTERM whatever ran under the recorded PID; `status`, `train`, `nodes`, `env` and
`report` waited minutes on Ray's driver retrying a cluster that was gone; `up` called a platform
whose cluster was gone "already up" (the real-platform cases, a copied record and `up` over a
crashed platform's record, are in test_platform_up_down.py).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from switchyard.cli._auth import ensure_admin_key
from switchyard.cluster.record import PlatformRecord, read_record, write_record
from switchyard.cluster.supervisor import (
    HEAD_MODULE,
    LOCK_FILE,
    StateDirTaken,
    Supervisor,
    claim_state_dir,
    look_up,
    supervised_state_dir,
)
from switchyard.db.schemas import migrate_stores

PY = "/usr/bin/python3"


def test_only_a_switchyard_head_supervises_a_state_dir() -> None:
    cwd = Path("/home/op")
    head = [PY, "-m", HEAD_MODULE, "--state-dir", "/srv/a", "--policies", "/p", "--gpus", "8"]
    assert supervised_state_dir(head, cwd) == Path("/srv/a")
    assert supervised_state_dir([PY, "-u", "-X", "dev", "-m", HEAD_MODULE, "--state-dir=/srv/b"], cwd) == Path("/srv/b")
    assert supervised_state_dir([PY, "-m", HEAD_MODULE, "--state-dir", "rel"], cwd) == Path("/home/op/rel")
    # Not a head: another module, a script, `-c` naming the module later, no state dir at all.
    assert supervised_state_dir([PY, "-m", "switchyard.cli", "down", "--state-dir", "/srv/a"], cwd) is None
    assert supervised_state_dir([PY, "head.py", "-m", HEAD_MODULE, "--state-dir", "/srv/a"], cwd) is None
    assert supervised_state_dir([PY, "-c", "pass", "-m", HEAD_MODULE, "--state-dir", "/srv/a"], cwd) is None
    assert supervised_state_dir(["sleep", "60"], cwd) is None
    assert supervised_state_dir([PY, "-m", HEAD_MODULE], cwd) is None
    assert supervised_state_dir([], cwd) is None


def test_a_supervisor_serves_only_its_own_state_dir(tmp_path: Path) -> None:
    assert Supervisor(alive=True, state_dir=tmp_path.resolve()).serves(tmp_path)
    assert Supervisor(alive=True, state_dir=tmp_path.resolve()).serves_another(tmp_path) is None
    assert Supervisor(alive=True, state_dir=tmp_path.resolve()).serves_another(tmp_path / "b") == tmp_path.resolve()
    assert Supervisor(alive=False, state_dir=tmp_path.resolve()).serves_another(tmp_path / "b") is None
    assert not Supervisor(alive=True, state_dir=tmp_path.resolve()).serves(tmp_path / "other")
    assert not Supervisor(alive=False, state_dir=tmp_path.resolve()).serves(tmp_path)
    assert not Supervisor(alive=True, state_dir=None).serves(tmp_path)


def test_look_up_reads_a_live_process_and_a_gone_one() -> None:
    sleeper = subprocess.Popen(["sleep", "60"])
    try:
        assert look_up(sleeper.pid) == Supervisor(alive=True, state_dir=None)
    finally:
        sleeper.kill()
        sleeper.wait()
    assert look_up(sleeper.pid).alive is False


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def gone_pid() -> int:
    """The PID of a process that has exited and been reaped."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def platform_record(state: Path, pid: int, owns_cluster: bool = True) -> PlatformRecord:
    port = closed_port()
    return PlatformRecord(
        ray_address=f"127.0.0.1:{port}",
        dashboard_url=f"http://127.0.0.1:{port}",
        gateway_url=f"http://127.0.0.1:{port}",
        owns_cluster=owns_cluster,
        supervisor_pid=pid if owns_cluster else None,
        ray_temp_dir=str(state / "ray"),
        policies_dir=str(state / "policies"),
        state_dir=str(state),
        gpus=8,
        started_at=time.time(),
    )


# Each command answers a stale record in seconds; before, Ray's driver retried for minutes.
ANSWER_WITHIN_S = 60


def switchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args],
        capture_output=True,
        text=True,
        timeout=ANSWER_WITHIN_S,
        env={**os.environ, "RAY_ADDRESS": ""},
    )


def switchyard_down(state: Path) -> subprocess.CompletedProcess[str]:
    return switchyard("down", "--state-dir", str(state))


def test_down_of_a_record_whose_supervisor_pid_is_another_process_leaves_that_process_alone(tmp_path: Path) -> None:
    """A crashed platform's record outlives it and its PID is reused: `down` clears the record,
    says the supervisor had already stopped, and signals nothing."""
    state = tmp_path / "state"
    state.mkdir()
    reused = subprocess.Popen(["sleep", "60"])  # what now runs under the recorded PID
    try:
        write_record(state, platform_record(state, reused.pid))
        down = switchyard_down(state)
        assert down.returncode == 0, down.stderr
        assert f"(PID {reused.pid}) had already stopped" in down.stderr
        assert "Traceback" not in down.stderr
        assert read_record(state) is None
        time.sleep(0.5)  # a SIGTERM, had one been sent, has landed by now
        assert reused.poll() is None, f"down signalled PID {reused.pid}, which was not its supervisor"
    finally:
        reused.kill()
        reused.wait()


def stale_state(tmp_path: Path, owns_cluster: bool) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    write_record(state, platform_record(state, gone_pid(), owns_cluster=owns_cluster))
    return state


@pytest.mark.parametrize(
    ("owns_cluster", "why"),
    [(True, "is no longer running: the machine restarted"), (False, "does not answer")],
    ids=["crashed-local-platform", "attached-cluster-gone"],
)
def test_commands_on_a_stale_record_say_the_platform_is_not_running(
    tmp_path: Path, owns_cluster: bool, why: str
) -> None:
    state = stale_state(tmp_path, owns_cluster)
    admin = ensure_admin_key(state)
    assert admin is not None
    key = ["--api-key", admin]
    for command in (["status", *key], ["train", "list", *key], ["nodes", "list", *key], ["env"]):
        answer = switchyard(*command, "--state-dir", str(state))
        said = answer.stderr
        assert answer.returncode == 2, f"{command}: {answer.returncode}\n{answer.stdout}\n{said}"
        assert f"no platform is running for state dir {state}" in said and why in said, f"{command}: {said}"
        assert f"`switchyard down --state-dir {state}` clears the record" in said and "Traceback" not in said
        assert answer.stdout == "", f"{command} printed exports or figures of a platform that is not running"
    # The report is made from the databases alone, and says why.
    out = tmp_path / "report.html"
    made = switchyard("report", "--state-dir", str(state), "--api-key", admin, "--out", str(out), "--json")
    assert made.returncode == 0 and why in made.stderr, made.stderr
    assert json.loads(made.stdout)["gpus"] == {"scheduler": False} and out.exists()
    assert read_record(state) is not None  # only `down` clears a record


def test_down_of_an_attached_platform_whose_cluster_is_gone_clears_its_record(tmp_path: Path) -> None:
    state = stale_state(tmp_path, owns_cluster=False)
    record = read_record(state)
    assert record is not None
    down = switchyard_down(state)
    assert down.returncode == 1 and "nothing was stopped: its Ray cluster at" in down.stderr, down.stderr
    assert f"switchyard up --address {record.ray_address} --state-dir {state}" in down.stderr
    assert read_record(state) is None and "Traceback" not in down.stderr


def test_up_over_an_attached_platform_whose_cluster_is_gone_says_so(tmp_path: Path) -> None:
    """`up` used to answer "already up" here, while `status` and `down` said the platform was
    not running: it names the silent cluster, and leaves the record to `down`, which says how
    to attach again if the cluster comes back."""
    state = stale_state(tmp_path, owns_cluster=False)
    record = read_record(state)
    assert record is not None
    up = switchyard("up", "--detach", "--state-dir", str(state))
    said = up.stderr
    assert up.returncode == 2 and "already up" not in said, said
    assert (
        f"no platform is running for state dir {state}" in said and f"its Ray cluster at {record.ray_address}" in said
    )
    assert f"`switchyard down --state-dir {state}` clears the record" in said and "Traceback" not in said
    assert read_record(state) == record


# A record damaged on disk, or edited by hand: cut short, empty, a field of another type, one missing.
DAMAGED_RECORDS = ('{"ray_address": "127.0.0.1:6379", "gpus": 8', "", '"gpus": "eight"', '"started_at": ')


def _damaged(good: str, how: str) -> str:
    if how.startswith('"') and how.endswith(": "):  # that field deleted
        field = how.rstrip(": ")
        return json.dumps({k: v for k, v in json.loads(good).items() if f'"{k}"' != field})
    if how.startswith('"gpus"'):
        return good.replace('"gpus": 8', how)
    return how


def test_every_command_refuses_a_damaged_record_by_name_and_leaves_it(tmp_path: Path) -> None:
    """Found by damaging `up.json` (stop 44): `down`, `status`, `up`, `env` and the rest raised a
    pydantic traceback. Each now refuses with an error that names the file and says what to do
    (no command can tell from it what `up` started, so none guesses), starts and stops nothing,
    and leaves the file as it was for the operator."""
    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    admin = ensure_admin_key(state)
    assert admin is not None
    write_record(state, platform_record(state, gone_pid()))
    good = (state / "up.json").read_text()
    assert '"gpus": 8' in good
    key = ["--api-key", admin]
    commands = (
        ["down"],
        ["status", *key],
        ["up", "--detach"],
        ["env"],
        ["train", "list", *key],
        ["nodes", "list", *key],
    )
    for n, command in enumerate(commands):
        damaged = _damaged(good, DAMAGED_RECORDS[n % len(DAMAGED_RECORDS)])
        (state / "up.json").write_text(damaged)
        answer = switchyard(*command, "--state-dir", str(state))
        said = answer.stderr
        assert answer.returncode == 2, f"{command} on {damaged!r}: {answer.returncode}\n{said}"
        assert f"{state / 'up.json'} is not a platform record" in said and "Traceback" not in said, said
        assert "If no platform runs from there, delete the file" in said, said
        assert (state / "up.json").read_text() == damaged, f"{command} changed the damaged record"
        assert answer.stdout == ""
    running = subprocess.run(["pgrep", "-f", f"{HEAD_MODULE}.*{state}"], capture_output=True, text=True).stdout
    assert running == "", f"a supervisor was started over a damaged record: {running}"


# Claims the state dir as a supervisor does, starts a child the way a careless spawner would
# (passing on what it may), prints both PIDs and waits.
HOLDER = """
import subprocess, sys, time
from pathlib import Path
from switchyard.cluster.supervisor import claim_state_dir
claim_state_dir(Path(sys.argv[1]))
child = subprocess.Popen(["sleep", "60"], close_fds=False)
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_state_dir_has_one_supervisor_for_as_long_as_it_lives(tmp_path: Path) -> None:
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    child = int(holder.stdout.readline())
    try:
        with pytest.raises(StateDirTaken, match=f"another switchyard supervisor \\(PID {holder.pid}\\) already serves"):
            claim_state_dir(tmp_path)
        holder.kill()  # however it ends (SIGKILL here), its lock goes with it, even though its child lives on
        holder.wait()
        assert look_up(child).alive
        fd = claim_state_dir(tmp_path)
        os.close(fd)
    finally:
        holder.kill()
        holder.wait()
        os.kill(child, 9)


def test_up_attaching_to_an_address_where_no_cluster_answers_fails_at_once_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """Found trying a mistyped address (stop 43): `up --address` handed it to Ray's driver,
    which retried for more than five minutes, printing its own warnings, and `--demo` had
    already created a team key that was never shown (a live key nobody held)."""
    state, port = tmp_path / "state", closed_port()
    started = time.monotonic()
    up = switchyard("up", "--address", f"127.0.0.1:{port}", "--demo", "--detach", "--state-dir", str(state))
    assert up.returncode == 1 and time.monotonic() - started < ANSWER_WITHIN_S, up.stderr
    assert f"refusing to attach: the Ray cluster at 127.0.0.1:{port} does not answer" in up.stderr, up.stderr
    assert "nothing was started" in up.stderr and "Traceback" not in up.stderr, up.stderr
    assert not (state / "keys.db").exists() and not (state / "admin.key").exists()


def test_a_second_up_at_the_same_moment_names_the_first_by_its_pid(tmp_path: Path) -> None:
    """Two `up`s at once: the second found the lock taken before the first had written its PID
    into it, and said "PID ?" (a flaky CI run of test_local_platform_up_status_down, stop 48).
    It now waits a moment for the PID."""
    fd = os.open(tmp_path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the first `up` holds the lock; no PID yet
    writes_its_pid = threading.Timer(0.1, lambda: os.pwrite(fd, b"4242", 0))
    writes_its_pid.start()
    try:
        with pytest.raises(StateDirTaken, match=r"another switchyard supervisor \(PID 4242\) already serves"):
            claim_state_dir(tmp_path)
    finally:
        writes_its_pid.join()
        os.close(fd)
