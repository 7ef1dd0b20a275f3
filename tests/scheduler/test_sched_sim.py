"""The simulator on a slice of the Philly trace: every policy runs, reports the promised keys,
and a seed fixes the result."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from switchyard.cli import main
from switchyard.scheduler.fairness import jain, percentile
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.inference import AzureProfile, InferenceDemand, diurnal
from switchyard.scheduler.sim.metrics import merged_length
from switchyard.scheduler.sim.run import SimSpec, run
from switchyard.scheduler.sim.trace import classify, load_philly

TRACES = Path(__file__).resolve().parents[3] / "shared" / "traces"
PHILLY = TRACES / "philly_jobs_sep_oct_2017.csv"
needs_traces = pytest.mark.skipif(not PHILLY.exists(), reason="shared traces not present")


def _slice(policy: PolicyName, seed: int = 0) -> SimSpec:
    # Two days at the start of the trace, 300 jobs, a small cluster so that queues form.
    return SimSpec(PHILLY, gpus=64, policy=policy, window_from="2017-09-04",
                   window_to="2017-09-08", max_jobs=300, seed=seed, tail_days=2.0, anomaly=False)


@needs_traces
@pytest.mark.parametrize("policy", list(PolicyName))
def test_every_policy_replays_a_slice(policy: PolicyName) -> None:
    report = run(_slice(policy)).report
    for key in ("utilization", "jain_hourly_mean", "jain_hourly_p10", "share_ratio_min",
                "inference_slo_attainment", "lost_gpu_hours", "priority_inversion_gpu_hours",
                "quota_wait_gpu_hours", "preemptions", "offered_load"):
        assert key in report
    teams = report["teams"]
    assert isinstance(teams, dict) and teams
    for row in teams.values():
        assert {"wait_p50_s", "wait_p90_s", "wait_p99_s", "jct_mean_s", "wait_by_gang", "share_ratio",
                "inversion_gpu_hours", "quota_wait_gpu_hours"} <= set(row)
    assert 0.0 < float(report["utilization"]) <= 1.0  # type: ignore[arg-type]
    if policy in (PolicyName.FIFO, PolicyName.STATIC):
        assert report["preemptions"] == 0


@needs_traces
def test_switchyard_keeps_inference_within_its_bound_on_the_slice() -> None:
    assert run(_slice(PolicyName.SWITCHYARD)).report["inference_slo_attainment"] == 1.0


@needs_traces
def test_a_seed_fixes_the_whole_report() -> None:
    a = run(_slice(PolicyName.SWITCHYARD, seed=3)).report
    b = run(_slice(PolicyName.SWITCHYARD, seed=3)).report
    for report in (a, b):
        report.pop("sim_wall_s")
        report.pop("events_per_s")
    assert a == b


@needs_traces
def test_cli_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plot = tmp_path / "sim.png"
    code = main(["sim", "--trace", str(PHILLY), "--gpus", "64", "--window", "sep", "--max-jobs",
                 "60", "--json", "--plot", str(plot)])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    team = next(iter(report["teams"].values()))
    assert "wait_p99_s" in team and "sharing_anomaly_s" in team
    assert plot.stat().st_size > 0


def test_cli_names_a_bad_trace(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,duration,num_gpus,cluster\n2017-09-04 10:00:00,10,x,t\n")
    teams = tmp_path / "teams.csv"
    teams.write_text("vc,node num\nt,1\n")
    assert main(["sim", "--trace", str(bad), "--teams", str(teams), "--gpus", "8",
                 "--no-inference"]) == 2
    assert "bad.csv:2" in capsys.readouterr().err


def test_classification_rules() -> None:
    assert classify(8, 60, 0.9)[0].value == "training"
    assert classify(4, 3600, 0.9)[0].value == "batch-fine-tune"
    assert classify(4, 5 * 3600, 0.9)[0].value == "training"
    assert classify(1, 60, 0.1) == (classify(1, 60, 0.1)[0], None)
    assert classify(1, 7200, 0.1)[0].value == "batch-fine-tune"
    assert classify(1, 7200, 0.9)[0].value == "exploratory"


def test_metric_helpers() -> None:
    assert percentile([5, 1, 3, 2, 4], 50) == 3
    assert percentile([float(i) for i in range(1, 101)], 99) == 99
    assert jain([1, 1, 1]) == 1.0 and abs(jain([1, 0]) - 0.5) < 1e-9
    assert merged_length([(0, 10), (5, 15), (20, 30)]) == 25


def test_inference_demand_follows_the_day_and_scales_down_late() -> None:
    profile = AzureProfile((1.0,), 1000.0)
    demand = InferenceDemand(profile, peak_rps=100.0, seed=0, replica_tokens_per_s=1000.0)
    assert diurnal(14 * 3600) == pytest.approx(1.0)
    assert demand.needed(14 * 60) == 100 and demand.needed(2 * 60) == 30
    # 10-minute scale-down delay: just after the peak the target still holds the peak.
    assert demand.target(14 * 60 + 5) >= demand.needed(14 * 60)


@needs_traces
def test_loader_reads_every_row() -> None:
    jobs = load_philly(PHILLY, seed=0)
    assert len(jobs) == 52849
    assert all(sum(j.bundles) == j.gpus for j in jobs)
