"""Replay any trace (issue 18): the generic CSV, windows from the trace, warm-up, and the
report's pending reasons and most preemptions per job. Small generated traces only."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from switchyard.cli import main
from switchyard.scheduler.sim.engine import JobRecord
from switchyard.scheduler.sim.inference import load_azure_profile, packaged_profile
from switchyard.scheduler.sim.metrics import most_preempted
from switchyard.scheduler.sim.run import SimSpec, run
from switchyard.scheduler.sim.trace import load_trace
from switchyard.scheduler.sim.window import parse_duration, resolve_window, select_jobs

HEADER = "submit_time,duration_s,gpus,team,priority_class,gpu_type,gang\n"


def _trace(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + body)
    (tmp_path / "teams.csv").write_text("vc,node num\na,1\nb,1\n")
    return path


def _ten_days(tmp_path: Path) -> Path:
    # One 1-GPU job a day, 2031-03-01 .. 2031-03-10 at noon; day 3 in unix seconds.
    rows = [f"2031-03-{d:02d}T12:00:00,600,1,a,,," for d in range(1, 11)]
    rows[2] = "1930305600,600,1,a,,,"  # 2031-03-03T12:00:00Z
    return _trace(tmp_path, "\n".join(rows) + "\n")


def test_a_2031_trace_replays_its_jobs(tmp_path: Path) -> None:
    path = _trace(
        tmp_path,
        "2031-05-02T09:00:00,3600,8,a,training,H100,1x8\n"
        "2031-05-02T09:30:00Z,1800,2,b,,,\n"
        "1935644400,7200,16,b,,H100,2x8\n"  # 2031-05-04T07:00:00Z
        "2031-05-03T00:00:00,60,1,a,exploratory,,\n",
    )
    spec = SimSpec(path, gpus=16, teams_file=tmp_path / "teams.csv", inference=False, anomaly=False, tail_days=2)
    report = run(spec).report
    assert report["jobs"] == 4 and report["trace_epoch"] == "2031-05-02T00:00:00+00:00"
    teams = report["teams"]
    assert isinstance(teams, dict)
    assert sum(t["unfinished"] for t in teams.values()) == 0
    assert report["pending_at_end"] == 0 and report["max_preemptions_per_job"] == 0


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("2031-05-02T09:00:00,3600,x,a,,,", "jobs.csv:3: column 'gpus': 'x'"),
        ("2031-05-02T09:00:00,-5,1,a,,,", "jobs.csv:3: column 'duration_s': '-5'"),
        ("May 2nd,3600,1,a,,,", "jobs.csv:3: column 'submit_time': 'May 2nd'"),
        ("2031-05-02T09:00:00,3600,8,a,,,3x8", "jobs.csv:3: column 'gang': '3x8' is 24 GPUs, gpus is 8"),
        ("2031-05-02T09:00:00,3600,8,a,,,8", "jobs.csv:3: column 'gang': '8'"),
        ("2031-05-02T09:00:00,3600,16,a,,,1x16", "jobs.csv:3: column 'gang': a bundle of 16 GPUs"),
        ("2031-05-02T09:00:00,3600,1,,,,", "jobs.csv:3: column 'team': ''"),
        ("2031-05-02T09:00:00,3600,1,a,vip,,", "job job-3 has priority class 'vip'"),
        ("1e30,3600,1,a,,,", "jobs.csv:3: column 'submit_time': '1e30': unix seconds out of range"),
        ("nan,3600,1,a,,,", "jobs.csv:3: column 'submit_time': 'nan': unix seconds out of range"),
        ("2031-05-02T09:00:00,inf,1,a,,,", "jobs.csv:3: column 'duration_s': 'inf': must be a finite number"),
        ("9000-01-01T00:00:00,3600,1,a,,,", "from line 2 (2031-05-02) to line 3 (9000-01-01); a trace may span"),
        # Found by a generated fuzz of the CSV (stop 44): a GPU count of 20 digits raised
        # OverflowError; one of 9 digits built a tuple of 10^8 bundles (6.6 GB, 80 s).
        (
            "2031-05-02T09:00:00,3600,99999999999999999999,a,,,",
            "jobs.csv:3: column 'gpus': '99999999999999999999': a job may ask for at most 100,000 GPUs",
        ),
        ("2031-05-02T09:00:00,3600,800000,a,,,100000x8", "jobs.csv:3: column 'gpus': '800000': a job may ask"),
        ("2031-05-02T09:00:00,3600,8,a,,,100000x8", "jobs.csv:3: column 'gang': '100000x8': a job may ask for at most"),
    ],
)
def test_bad_rows_are_named_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], row: str, message: str
) -> None:
    path = _trace(tmp_path, f"2031-05-02T08:00:00,60,1,a,,,\n{row}\n")
    args = ["sim", "--trace", str(path), "--teams", str(tmp_path / "teams.csv"), "--gpus", "16", "--no-inference"]
    assert main([*args, "--no-anomaly"]) != 0
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_a_header_of_neither_format_is_named(tmp_path: Path) -> None:
    path = tmp_path / "x.csv"
    path.write_text("when,how_long\n1,2\n")
    with pytest.raises(ValueError, match=r"x.csv: header is neither.*missing \['duration_s', 'gpus'"):
        load_trace(path, seed=0)


def test_fractions_and_warmup_select_the_right_jobs(tmp_path: Path) -> None:
    trace = load_trace(_ten_days(tmp_path), seed=0)
    day = [int(j.submit_s // 86400) for j in trace.jobs]
    assert day == list(range(10))  # epoch: midnight before the first job; unix seconds agree

    def picked(frm: str | None, to: str | None, warmup: str | None) -> tuple[list[int], list[int]]:
        window = resolve_window(trace, frm, to, None if warmup is None else parse_duration(warmup))
        kept = select_jobs(trace.jobs, window, None)
        return [int(j.submit_s // 86400) for j in kept], [int(j.submit_s // 86400) for j in kept if window.measures(j)]

    assert picked(None, None, None) == (list(range(10)), list(range(10)))  # default: the whole trace
    assert picked("0.5", None, None) == (list(range(10)), [5, 6, 7, 8, 9])  # earlier jobs warm up
    assert picked("0.5", "0.75", "2d") == ([3, 4, 5, 6], [5, 6])
    assert picked(None, "1", "3d") == (list(range(10)), [3, 4, 5, 6, 7, 8, 9])  # warm-up: first 3 days
    assert picked("2031-03-04", "2031-03-06T12:00:00", "0") == ([3, 4], [3, 4])  # the end is exclusive
    with pytest.raises(ValueError, match=r"fraction must lie in 0\.\.1"):
        resolve_window(trace, "1.5", None, None)
    with pytest.raises(ValueError, match="is empty"):
        resolve_window(trace, "0.8", "0.2", None)
    assert math.isinf(resolve_window(trace, "0.5", None, None).replay_from_s)


def test_cli_window_flags_and_warmup_reach_the_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _ten_days(tmp_path)
    args = ["sim", "--trace", str(path), "--teams", str(tmp_path / "teams.csv"), "--gpus", "8", "--no-inference"]
    assert main([*args, "--no-anomaly", "--from", "0.5", "--warmup", "2d", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 5 and report["window_s"]["start"] == pytest.approx(4.5 * 86400 + 43200 + 0.5)
    assert main([*args, "--window", "oct", "--to", "1"]) != 0
    assert "exclusive" in capsys.readouterr().err
    assert main([*args, "--warmup", "soon"]) != 0
    assert "duration 'soon'" in capsys.readouterr().err


def test_the_report_names_pending_reasons_and_the_most_preempted_job(tmp_path: Path) -> None:
    # b's guarantee is 8 GPUs of 16; a non-preemptible 16-GPU gang may not borrow: quota.
    path = _trace(tmp_path, "2031-05-02T09:00:00,600,1,a,,,\n2031-05-02T09:00:00,600,16,b,production-inference,,2x8\n")
    spec = SimSpec(path, gpus=16, teams_file=tmp_path / "teams.csv", inference=False, anomaly=False, tail_days=0.5)
    report = run(spec).report
    assert report["pending_by_reason"] == {"quota": 1}
    pending = report["pending"]
    assert isinstance(pending, list) and len(pending) == 1
    row = pending[0]
    assert row["workload_id"] == "job-3" and row["reason"] == "quota" and row["gpus"] == 16


def test_most_preempted_counts_notices_per_job() -> None:
    def job(wid: str, preemptions: int) -> JobRecord:
        return JobRecord(wid, "a", 1, "batch", 0.0, 1.0, 1.0, None, 0.0, preemptions=preemptions)

    assert most_preempted([job("x", 2), job("y", 5), job("z", 5)]) == {
        "max_preemptions_per_job": 5,
        "most_preempted_job": "y",
    }
    assert most_preempted([]) == {"max_preemptions_per_job": 0, "most_preempted_job": None}


POLICY = """version: 1
teams:
  - name: inference
    quotas: [{classes: [inference], guaranteed_gpus: 4}]
  - name: a
    quotas: [{classes: [training, batch-fine-tune, exploratory], guaranteed_gpus: 8}]
  - name: b
    quotas: [{classes: [training, batch-fine-tune, exploratory], guaranteed_gpus: 4}]
"""


def test_an_operators_own_trace_replays_from_its_own_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # docs/scheduler.md's example: a spreadsheet export (byte-order mark before the header)
    # and a policy file, in a directory with neither Philly's team sizes nor the Azure trace.
    trace = tmp_path / "mine.csv"
    trace.write_bytes(
        ("\ufeff" + HEADER + "2031-05-02T09:00:00,3600,8,a,,,\n2031-05-02T10:00:00,600,2,b,,,\n").encode("utf-8")
    )
    policy = tmp_path / "scheduler.yaml"
    policy.write_text(POLICY)
    args = ["sim", "--trace", str(trace), "--policy-file", str(policy), "--gpus", "16", "--no-anomaly", "--json"]
    assert main(args) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    assert report["jobs"] == 2
    assert report["inference_guarantee_gpus"] > 0  # the shipped burst profile drove inference


def test_a_trace_without_team_guarantees_says_what_to_give(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "mine.csv"
    trace.write_text(HEADER + "2031-05-02T09:00:00,3600,8,a,,,\n")
    assert main(["sim", "--trace", str(trace), "--gpus", "16", "--no-inference", "--no-anomaly"]) != 0
    err = capsys.readouterr().err
    assert "no team guarantees" in err and "--policy-file" in err and "--teams" in err
    assert "Traceback" not in err


def test_a_trace_without_rows_is_named(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # It used to replay nothing and print a report of zeros, as if the cluster had been idle.
    path = _trace(tmp_path, "")
    args = ["sim", "--trace", str(path), "--teams", str(tmp_path / "teams.csv"), "--gpus", "16", "--no-anomaly"]
    assert main(args) == 2
    assert "jobs.csv: no jobs: the file has a header and no rows" in capsys.readouterr().err


def test_a_philly_row_names_its_bad_column(tmp_path: Path) -> None:
    path = tmp_path / "philly.csv"
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,60,0,0,a\n")
    with pytest.raises(ValueError, match=r"philly.csv:2: column 'num_gpus': '0': must be a positive integer"):
        load_trace(path, seed=0)
    path.write_text("timestamp,duration,num_gpus,gpu_time,cluster\n2017-10-01 00:00:00,inf,1,0,a\n")
    with pytest.raises(ValueError, match=r"philly.csv:2: column 'duration': 'inf'"):
        load_trace(path, seed=0)


AZURE = Path(__file__).resolve().parents[3] / "shared" / "traces" / "azure_llm_inference_conv_2023.csv"


@pytest.mark.skipif(not AZURE.exists(), reason="shared traces not present")
def test_the_shipped_inference_profile_is_the_azure_traces() -> None:
    # The default profile must be exactly what --azure <the Azure CSV> gives, so the
    # documented results do not depend on the CSV lying next to the trace.
    assert packaged_profile() == load_azure_profile(AZURE)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--inference-peak-rps", "-5"], "--inference-peak-rps must be a finite number >= 0, got -5.0"),
        (["--inference-peak-rps", "nan"], "--inference-peak-rps must be a finite number >= 0"),
        (["--slo-bound-s", "-1"], "--slo-bound-s must be a positive number of seconds, got -1.0"),
        (["--max-jobs", "-1"], "--max-jobs must be >= 0, got -1"),
        (["--plot", "/nonexistent-switchyard-dir/wait.png"], "directory /nonexistent-switchyard-dir does not exist"),
    ],
)
def test_flags_a_run_cannot_mean_are_refused_before_it_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], flags: list[str], message: str
) -> None:
    # The plot's directory is checked before the replay: a long run must not end in a
    # traceback and lose its report.
    path = _trace(tmp_path, "2031-05-02T09:00:00,600,1,a,,,\n")
    args = ["sim", "--trace", str(path), "--teams", str(tmp_path / "teams.csv"), "--gpus", "16", "--no-anomaly"]
    assert main([*args, *flags]) == 2
    captured = capsys.readouterr()
    assert message in captured.err and "Traceback" not in captured.err
    assert captured.out == ""
