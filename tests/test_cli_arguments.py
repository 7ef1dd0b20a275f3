"""Numbers a command cannot mean are refused by name before anything starts, and an output path
that cannot be written is an error, not a traceback; each command runs as a user runs it, in its
own process.

Found by typing such values (stop 44): `sim --gpus 1000000000` ran out of memory building the
simulated cluster's nodes; `audit query --limit 99999999999999999999` raised OverflowError from
the SQLite driver; `up` took any `--gpus`, `--timeout nan` or a port above 65,535 and handed them
to Ray; `report --out` into a missing directory raised FileNotFoundError.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from switchyard.cli._auth import ensure_admin_key
from switchyard.db.schemas import migrate_stores


def _switchyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )


@pytest.mark.parametrize(
    ("args", "said"),
    [
        (["up", "--gpus", "1000000000"], "argument --gpus: 1000000000 is not between 0 and 100,000"),
        (["up", "--gpus", "-8"], "argument --gpus: -8 is not between 0 and 100,000"),
        (["up", "--cpus", "0"], "argument --cpus: 0 is not between 1 and 10,000"),
        (["up", "--gateway-port", "70000"], "argument --gateway-port: 70000 is not between 1 and 65,535"),
        (["up", "--timeout", "nan"], "argument --timeout: nan is not a finite number of seconds above 0"),
        (["up", "--timeout", "-5"], "argument --timeout: -5 is not a finite number of seconds above 0"),
        (["up", "--local-model-gpus", "x"], "argument --local-model-gpus: 'x' is not a whole number"),
        (["audit", "query", "--limit", "99999999999999999999"], "argument --limit: 99999999999999999999 is not"),
        (["audit", "query", "--limit", "0"], "argument --limit: 0 is not between 1 and 10,000"),
        (["audit", "export", "--bucket", "b", "--segment-size", "0"], "argument --segment-size: 0 is not between"),
        (["train", "run", "job.yaml", "--nproc", "0"], "argument --nproc: 0 is not between 1 and 1,024"),
    ],
)
def test_a_number_a_command_cannot_mean_is_refused_by_its_flag(tmp_path: Path, args: list[str], said: str) -> None:
    state = tmp_path / "state"
    answer = _switchyard(*args, "--state-dir", str(state))
    assert answer.returncode == 2, f"{args}: {answer.returncode}\n{answer.stderr}"
    assert said in answer.stderr and "Traceback" not in answer.stderr, answer.stderr
    assert not (state / "up.json").exists(), "a platform was started"


def test_a_simulated_cluster_too_large_to_build_is_refused(tmp_path: Path) -> None:
    trace = tmp_path / "jobs.csv"
    trace.write_text("submit_time,duration_s,gpus,team\n2031-05-02T09:00:00,60,1,a\n")
    (tmp_path / "teams.csv").write_text("vc,node num\na,1\n")
    answer = _switchyard(
        "sim", "--trace", str(trace), "--teams", str(tmp_path / "teams.csv"), "--gpus", "1000000000", "--no-inference"
    )
    assert answer.returncode == 2 and "--gpus must be at most 100,000, got 1,000,000,000" in answer.stderr


def test_a_report_that_cannot_be_written_is_named(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    admin = ensure_admin_key(state)
    assert admin is not None
    out = tmp_path / "missing" / "report.html"
    answer = _switchyard("report", "--state-dir", str(state), "--api-key", admin, "--out", str(out))
    assert answer.returncode == 2, answer.stderr
    assert f"cannot write the report to {out}: No such file or directory" in answer.stderr, answer.stderr
    assert "Traceback" not in answer.stderr
