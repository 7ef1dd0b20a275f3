"""`switchyard down` of a local platform signals the PID its record names only when that process
is the supervisor of this state dir. A record copied into another state dir, or one a crashed
supervisor left behind whose PID now belongs to another process, used to get that process a
SIGTERM (the real-platform case, a copied record, is in test_platform_up_down.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from switchyard.cluster.record import PlatformRecord, read_record, write_record
from switchyard.cluster.supervisor import HEAD_MODULE, Supervisor, look_up, supervised_state_dir

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


def local_record(state: Path, pid: int) -> PlatformRecord:
    return PlatformRecord(
        ray_address="127.0.0.1:1",
        dashboard_url=None,
        gateway_url="http://127.0.0.1:1",
        owns_cluster=True,
        supervisor_pid=pid,
        ray_temp_dir=str(state / "ray"),
        policies_dir=str(state / "policies"),
        state_dir=str(state),
        gpus=8,
        started_at=time.time(),
    )


def switchyard_down(state: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", "down", "--state-dir", str(state)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )


def test_down_of_a_record_whose_supervisor_pid_is_another_process_leaves_that_process_alone(tmp_path: Path) -> None:
    """A crashed platform's record outlives it and its PID is reused: `down` clears the record,
    says the supervisor had already stopped, and signals nothing."""
    state = tmp_path / "state"
    state.mkdir()
    reused = subprocess.Popen(["sleep", "60"])  # what now runs under the recorded PID
    try:
        write_record(state, local_record(state, reused.pid))
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
