"""The scheduler benches' shared inputs (`bench/sim_inputs.py`) and the tuning grid's knob
parser (`bench/scheduler_tune.py`): the tables in docs/scheduler_results.md at other cluster
sizes run the shipped knobs and classes with teams sized for that cluster, and a tuning row
changes exactly the knob it names. The per-class table (`bench/class_waits.py`) counts every
job of the window once, under the class it ran as."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # after the tests' own modules: bench names never shadow them

import class_waits  # noqa: E402
import scheduler_tune  # noqa: E402
import sim_inputs  # noqa: E402


def test_a_sized_policy_file_keeps_the_knobs_and_classes_and_drops_the_teams(tmp_path: Path) -> None:
    shipped = load_policy_file(sim_inputs.POLICY_FILE)
    assert shipped.teams, "the bench file names teams sized for 672 GPUs"
    sized = load_policy_file(sim_inputs.without_teams(sim_inputs.POLICY_FILE, tmp_path))
    assert not sized.teams
    assert sized.to_policy().knobs == shipped.to_policy().knobs
    assert sized.to_policy().priority_classes == shipped.to_policy().priority_classes
    with sim_inputs.for_size(sim_inputs.POLICY_FILE, False) as as_given:
        assert as_given == sim_inputs.POLICY_FILE


@pytest.mark.skipif(not sim_inputs.TRACE.exists(), reason="shared traces not present")
def test_a_run_at_another_size_gets_guarantees_that_fit_that_cluster() -> None:
    frm, to = WINDOWS["sep"]

    def guarantees(size_teams: bool) -> int:
        with sim_inputs.for_size(sim_inputs.POLICY_FILE, size_teams) as policy_file:
            report = run(
                SimSpec(
                    sim_inputs.TRACE,
                    64,
                    PolicyName.SWITCHYARD,
                    frm,
                    to,
                    policy_file=policy_file,
                    anomaly=False,
                    max_jobs=40,
                )
            ).report
        teams = report["teams"]
        assert isinstance(teams, dict)
        return sum(int(row["quota_gpus"]) for row in teams.values())

    assert guarantees(False) > 64  # the file's teams, sized for 672 GPUs
    assert guarantees(True) <= 64


def test_a_tuning_row_types_its_values_as_the_knob_is_typed() -> None:
    assert scheduler_tune.parse_variation("max_preemption_attempts=2,8") == ("max_preemption_attempts", [2, 8])
    assert scheduler_tune.parse_variation("starvation_after_s=none,21600") == ("starvation_after_s", [None, 21600.0])
    assert scheduler_tune.parse_variation("starvation_preempt_after_s=172800") == (
        "starvation_preempt_after_s",
        [172800.0],
    )
    assert scheduler_tune.parse_variation("starving_blocks_team=false,on") == ("starving_blocks_team", [False, True])
    with pytest.raises(SystemExit, match="max_reservations"):
        scheduler_tune.parse_variation("max_reservation=1")
    with pytest.raises(SystemExit, match="knob=v1,v2"):
        scheduler_tune.parse_variation("max_reservations")


@pytest.mark.skipif(not sim_inputs.TRACE.exists(), reason="shared traces not present")
def test_the_class_table_counts_each_window_job_once_under_its_class() -> None:
    frm, to = WINDOWS["sep"]
    spec = SimSpec(sim_inputs.TRACE, 64, PolicyName.SWITCHYARD, frm, to, anomaly=False, max_jobs=60, seed=1)
    by_class = class_waits.class_waits(spec)
    trace = run(spec).trace
    window_jobs = [j for j in trace.jobs if trace.window.start_s <= j.submit_s < trace.window.end_s]
    assert sum(row["jobs"] for row in by_class.values()) == len(window_jobs) > 0
    assert set(by_class) == {j.priority_class for j in window_jobs}
    for name, row in by_class.items():
        waits = sorted(j.wait_s for j in window_jobs if j.priority_class == name)
        assert row["p50"] <= row["p99"] <= row["max"] == waits[-1]
        assert row["over_a_day"] == sum(w > class_waits.DAY_S for w in waits)
