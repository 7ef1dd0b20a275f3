"""Numbers a command cannot mean are refused by name before anything starts, and an output path
that cannot be written is an error, not a traceback; each command runs as a user runs it, in its
own process.

Found by typing such values (stop 44): `sim --gpus 1000000000` ran out of memory building the
simulated cluster's nodes; `audit query --limit 99999999999999999999` raised OverflowError from
the SQLite driver; `up` took any `--gpus`, `--timeout nan` or a port above 65,535 and handed them
to Ray; `report --out` into a missing directory raised FileNotFoundError; `budgets --since
2026-13-45` matched no day in silence; a ledger database that refused or was not a database, and
S3 without credentials or not answering, printed the driver's traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from switchyard.cli._auth import ensure_admin_key
from switchyard.db.schemas import migrate_stores


def _switchyard(*args: str, env: dict[str, str | None] | None = None) -> subprocess.CompletedProcess[str]:
    """`switchyard ARGS` in its own process; `env` adds variables, and removes those set to None."""
    merged: dict[str, str | None] = {**os.environ, "RAY_ADDRESS": "", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in merged.items() if v is not None},
    )


def _operator_state(tmp_path: Path) -> tuple[Path, str]:
    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    admin = ensure_admin_key(state)
    assert admin is not None
    return state, admin


REFUSED_BY_FLAG = [
    (["up", "--gpus", "1000000000"], "argument --gpus: 1000000000 is not between 0 and 100,000"),
    (["up", "--gpus", "-8"], "argument --gpus: -8 is not between 0 and 100,000"),
    (["up", "--cpus", "0"], "argument --cpus: 0 is not between 1 and 10,000"),
    (["up", "--gateway-port", "70000"], "argument --gateway-port: 70000 is not between 1 and 65,535"),
    (["up", "--timeout", "nan"], "argument --timeout: nan is not a finite number of seconds above 0"),
    (["up", "--timeout", "-5"], "argument --timeout: -5 is not a finite number of seconds above 0"),
    (["up", "--local-model-gpus", "x"], "argument --local-model-gpus: 'x' is not a whole number"),
    (["audit", "query", "--limit", "99999999999999999999"], "argument --limit: 99999999999999999999 is not"),
    (["audit", "query", "--limit", "0"], "argument --limit: 0 is not between 1 and 1,000,000,000"),
    (["audit", "export", "--bucket", "b", "--segment-size", "0"], "argument --segment-size: 0 is not between"),
    (["train", "run", "job.yaml", "--nproc", "0"], "argument --nproc: 0 is not between 1 and 1,024"),
    (["budgets", "--since", "2026-13-45"], "argument --since: '2026-13-45' is not a day (YYYY-MM-DD)"),
    (["budgets", "--since", "20261205"], "argument --since: '20261205' is not a day (YYYY-MM-DD)"),
]

# Runs every case in one process (argparse refuses before anything is imported or started), so
# the table costs one interpreter start, not one each.
_EACH = """
import contextlib, io, json, sys
from switchyard.cli import main
answers = []
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    answers.append([code, err.getvalue()])
print(json.dumps(answers))
"""


def test_a_number_a_command_cannot_mean_is_refused_by_its_flag(tmp_path: Path) -> None:
    state = tmp_path / "state"
    argvs = [[*args, "--state-dir", str(state)] for args, _ in REFUSED_BY_FLAG]
    done = subprocess.run(
        [sys.executable, "-c", _EACH, json.dumps(argvs)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "RAY_ADDRESS": ""},
    )
    assert done.returncode == 0, done.stderr
    for (args, said), (code, err) in zip(REFUSED_BY_FLAG, json.loads(done.stdout), strict=True):
        assert code == 2, f"{args}: exit {code}\n{err}"
        assert said in err and "Traceback" not in err, f"{args}: {err}"
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
    state, admin = _operator_state(tmp_path)
    out = tmp_path / "missing" / "report.html"
    answer = _switchyard("report", "--state-dir", str(state), "--api-key", admin, "--out", str(out))
    assert answer.returncode == 2, answer.stderr
    assert f"cannot write the report to {out}: No such file or directory" in answer.stderr, answer.stderr
    assert "Traceback" not in answer.stderr


@pytest.mark.parametrize(
    ("ledger", "said"),
    [
        (
            "postgresql://nobody:hunter2@127.0.0.1:1/ledger",
            "cannot open the database postgresql://nobody@127.0.0.1:1/ledger: connection failed",
        ),
        (
            "sqlite:///{tmp}/not-a-database.db",
            "cannot open the database sqlite:///{tmp}/not-a-database.db: file is not",
        ),
    ],
    ids=["postgres-refused", "not-sqlite"],
)
def test_a_database_that_cannot_be_opened_is_named_without_its_password(tmp_path: Path, ledger: str, said: str) -> None:
    state, admin = _operator_state(tmp_path)
    (tmp_path / "not-a-database.db").write_text("these are not the pages of a database\n" * 200)
    answer = _switchyard(
        "budgets", "--state-dir", str(state), "--api-key", admin, "--ledger", ledger.format(tmp=tmp_path)
    )
    assert answer.returncode == 2, answer.stderr
    assert said.format(tmp=tmp_path) in answer.stderr and "Traceback" not in answer.stderr, answer.stderr
    assert "hunter2" not in answer.stderr


@pytest.mark.parametrize("credentials", [False, True], ids=["no-credentials", "endpoint-silent"])
def test_s3_that_refuses_is_named(tmp_path: Path, credentials: bool) -> None:
    state, admin = _operator_state(tmp_path)
    env: dict[str, str | None] = {name: None for name in os.environ if name.startswith("AWS_")}
    env |= {"AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_CONFIG_FILE": str(tmp_path / "none")}
    env |= {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"} if credentials else {}
    env |= {"AWS_DEFAULT_REGION": "us-east-1", "AWS_MAX_ATTEMPTS": "1", "AWS_EC2_METADATA_DISABLED": "true"}
    args = ("--bucket", "audit", "--endpoint-url", "http://127.0.0.1:1", "--state-dir", str(state), "--api-key", admin)
    for command in (["audit", "verify"], ["audit", "export"]):
        answer = _switchyard(*command, *args, env=env)
        said = answer.stderr
        assert answer.returncode == 2 and "Traceback" not in said, f"{command}: {said}"
        why = "Could not connect to the endpoint URL" if credentials else "Unable to locate credentials"
        assert f"S3 (http://127.0.0.1:1, bucket 'audit'): {why}" in said, said


@pytest.mark.parametrize("command", [["budgets"], ["audit", "query"]])
def test_a_team_no_policy_names_and_no_record_holds_is_named(tmp_path: Path, command: list[str]) -> None:
    """`budgets --team ghots` printed an empty table and `total: $0.0000`, and `audit query`
    an empty one: a typo read as a team that had done nothing. A team the platform serves
    answers as before, even with nothing recorded."""
    state, admin = _operator_state(tmp_path)
    typo = _switchyard(*command, "--team", "ghots", "--state-dir", str(state), "--api-key", admin)
    assert typo.returncode == 2, typo.stderr
    assert typo.stderr.startswith("switchyard: error: unknown team 'ghots' (teams: ads, "), typo.stderr
    quiet = _switchyard(*command, "--team", "legal", "--state-dir", str(state), "--api-key", admin)
    assert quiet.returncode == 0 and quiet.stderr == "", quiet.stderr


def test_a_damaged_admin_key_file_is_named_and_up_replaces_it(tmp_path: Path) -> None:
    """An `admin.key` that is not UTF-8 made every command that acts as the operator print
    a `UnicodeDecodeError` traceback, and `switchyard up` fail the same way at every start.
    Now commands name the file, and `up` writes a new key over it (the file is only a copy:
    nothing in it can be lost)."""
    state, _ = _operator_state(tmp_path)
    (state / "admin.key").write_bytes(b"\xff\xfe not a key")
    answer = _switchyard("budgets", "--state-dir", str(state), env={"SWITCHYARD_API_KEY": None})
    assert answer.returncode != 0 and "Traceback" not in answer.stderr, answer.stderr
    assert f"{state / 'admin.key'} holds no key (it is not UTF-8 text)" in answer.stderr, answer.stderr
    new = ensure_admin_key(state)
    assert new is not None and (state / "admin.key").read_text().strip() == new
    again = _switchyard("budgets", "--state-dir", str(state), env={"SWITCHYARD_API_KEY": None})
    assert again.returncode == 0, again.stderr
