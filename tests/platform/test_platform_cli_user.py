"""The README's commands as a new user types them: each in its own process, from a shell that has
none of the test session's settings (no RAY_AUTH_MODE, no Ray address), against one platform
that `switchyard up --detach` started in another process, token auth on.

Found this way: `switchyard train submit` failed every time with a Ray AuthenticationError
traceback (the command imported ray before setting the platform's environment), and `switchyard
keys create` checked the team against the repository's policies, not the directory the running
platform was started with, and knew no team that only trains.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.ray, pytest.mark.own_cluster]

REPO = Path(__file__).resolve().parents[2]
SWITCHYARD = Path(sys.executable).parent / "switchyard"  # the console script a user runs


def fresh_shell(state: Path) -> dict[str, str]:
    """What a new terminal has: PATH, HOME, a locale, and the one variable the README sets."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR") if k in os.environ}
    env["SWITCHYARD_STATE_DIR"] = str(state)
    # Only to keep `down` short (a removed Serve replica otherwise stays reachable for 30 s so
    # load balancers deregister it); nothing this test checks depends on it.
    env["RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S"] = "3"
    return env


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, env=env, cwd=REPO, timeout=timeout)


def ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args} -> {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc.stdout


def one_clear_line(proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode != 0, proc.stdout
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr and len(lines) == 1, proc.stderr
    assert lines[0].startswith("switchyard: error: ") and says in lines[0], lines[0]


@pytest.fixture(scope="module")
def platform(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("user")
    state = root / "state"
    policies = root / "policies"
    shutil.copytree(REPO / "policies", policies)
    # A team the repository's policies do not have: only this platform serves it.
    team = (policies / "teams" / "search.yaml").read_text().replace("team: search", "team: newteam", 1)
    (policies / "teams" / "newteam.yaml").write_text(team)
    env = fresh_shell(state)
    up = json.loads(ok(run(env, str(SWITCHYARD), "up", "--demo", "--detach", "--policies", str(policies), "--json")))
    try:
        yield env, up, policies
    finally:
        run(env, str(SWITCHYARD), "down")


def test_the_readme_commands_work_from_a_fresh_shell(platform: Any) -> None:
    env, up, policies = platform
    sy = str(SWITCHYARD)
    assert "GPUs:" in ok(run(env, sy, "status"))

    # Keys: for a team only the running platform's policies have, and for a GPU-only team.
    made = json.loads(ok(run(env, sy, "keys", "create", "--team", "newteam", "--json")))
    assert made["team"] == "newteam"
    researcher = json.loads(ok(run(env, sy, "keys", "create", "--team", "research", "--json")))["key"]
    assert "newteam" in ok(run(env, sy, "keys", "list"))
    ok(run(env, sy, "keys", "revoke", made["key_id"]))

    # Training through the scheduler, as the researcher.
    as_researcher = {**env, "SWITCHYARD_API_KEY": researcher}
    config = "train_jobs/configs/demo-fsdp.yaml"
    queued = json.loads(ok(run(as_researcher, sy, "train", "submit", config, "--team", "research", "--json")))
    listed = json.loads(ok(run(env, sy, "train", "list", "--json")))
    assert queued["workload_id"] in {w["workload_id"] for w in listed}
    ok(run(as_researcher, sy, "train", "cancel", queued["workload_id"]))
    one_clear_line(run(as_researcher, sy, "train", "submit", "missing.yaml", "--team", "research"), "missing.yaml")

    # `ray job submit` goes through the same queue (the job queues itself with the scheduler),
    # after `eval "$(switchyard env)"` as the README says.
    exports = json.loads(ok(run(env, sy, "env", "--json")))
    assert exports["RAY_ADDRESS"] == up["dashboard_url"]
    job = run(
        {**env, **exports},
        str(Path(sys.executable).parent / "ray"),
        "job",
        "submit",
        "--no-wait",
        "--",
        sys.executable,
        "-m",
        "train_jobs.run",
        config,
        "--team",
        "research",
    )
    ok(job)
    deadline = time.monotonic() + 90
    while True:  # the job starts, then queues itself: it shows in `train list` as a workload
        others = [w for w in json.loads(ok(run(env, sy, "train", "list", "--json"))) if w != queued]
        if any(w["workload_id"] != queued["workload_id"] for w in others):
            break
        assert time.monotonic() < deadline, "the ray job never reached the scheduler's queue"
        time.sleep(2)

    # Money, audit, policy and the planner.
    assert json.loads(ok(run(env, sy, "budgets", "--json"))) is not None
    ok(run(env, sy, "audit", "verify"))
    assert "ok" in ok(run(env, sy, "policy", "check", str(policies)))
    ok(run(env, sy, "plan", "--spec", config, "--gpus", "8"))

    # Failures are one clear line.
    one_clear_line(run(env, sy, "keys", "create", "--team", "nosuchteam"), "unknown team 'nosuchteam'")


def test_an_operator_cordons_drains_and_uncordons_a_node(platform: Any) -> None:
    env, _, _ = platform
    sy = str(SWITCHYARD)
    rows = json.loads(ok(run(env, sy, "nodes", "list", "--json")))
    assert rows and {r["state"] for r in rows} == {"ready"}
    node = rows[0]["node_id"]
    try:
        assert json.loads(ok(run(env, sy, "nodes", "cordon", node[:12], "--json"))) == {"node": node, "cordoned": True}
        [listed] = [r for r in json.loads(ok(run(env, sy, "nodes", "list", "--json"))) if r["node_id"] == node]
        assert listed["state"] == "cordoned" and listed["alive"]
        assert f"node {node[:12]} cordoned" in ok(run(env, sy, "status"))
    finally:
        assert f"node {node[:12]} uncordoned" in ok(run(env, sy, "nodes", "uncordon", node))
    one_clear_line(run(env, sy, "nodes", "cordon", "no-such-node"), "unknown node 'no-such-node'")

    # A drain cordons the node and notices what may move; what may not (a Serve replica, a
    # non-preemptible lease) blocks it, named on one line, and the node stays cordoned.
    try:
        drained = run(env, sy, "nodes", "drain", node[:12], "--json")
        assert "Traceback" not in drained.stderr, drained.stderr
        report = json.loads(drained.stdout)
        assert report["node"] == node
        if report["blocking"]:
            assert drained.returncode == 1, drained.stdout
            [line] = [x for x in drained.stderr.splitlines() if x.strip()]
            assert line.startswith("switchyard: error: ") and "blocked by" in line, line
        else:
            assert drained.returncode == 0, drained.stderr
        [listed] = [r for r in json.loads(ok(run(env, sy, "nodes", "list", "--json"))) if r["node_id"] == node]
        assert listed["state"] in {"draining", "drained", "cordoned"}, listed
    finally:
        ok(run(env, sy, "nodes", "uncordon", node))
