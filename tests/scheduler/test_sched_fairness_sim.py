"""The fairness metrics as the simulator reports them (issue 18, findings 4 and 5), on small
generated traces whose answers are known: inversion split from quota waits, and a private
cluster that runs switchyard's reservation rules instead of starving its biggest gang."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import SimSpec, run

HEADER = "submit_time,duration_s,gpus,team,priority_class,gpu_type,gang\n"


def _trace(tmp_path: Path, rows: list[str]) -> Path:
    path = tmp_path / "jobs.csv"
    path.write_text(HEADER + "\n".join(rows) + "\n")
    (tmp_path / "teams.csv").write_text("vc,node num\na,1\nb,1\n")  # 16 GPUs: 8 guaranteed each
    return path


def test_waits_behind_lower_priority_are_inversions_or_quota_waits(tmp_path: Path) -> None:
    """FIFO (no preemption): team a's exploratory jobs hold all 16 GPUs for 10 h. An hour in,
    team b asks for 4 GPUs (inside its guarantee of 8: an inversion) and 16 (it would borrow:
    a quota wait). Both wait until 10 h; each counts from 300 s after it queued."""
    rows = ["2031-05-02T00:00:00,36000,1,a,exploratory,," for _ in range(16)]
    rows += ["2031-05-02T01:00:00,3600,4,b,training,,", "2031-05-02T01:00:00,3600,16,b,training,,2x8"]
    spec = SimSpec(
        _trace(tmp_path, rows), gpus=16, policy=PolicyName.FIFO, teams_file=tmp_path / "teams.csv",
        window_from="2031-05-02", window_to="2031-05-03", inference=False, anomaly=False, tail_days=2,
    )
    report = run(spec).report
    waited_h = 9.0 - 300 / 3600
    teams = report["teams"]
    assert isinstance(teams, dict)
    assert teams["b"]["inversion_gpu_hours"] == pytest.approx(4 * waited_h, abs=0.1)
    assert teams["b"]["quota_wait_gpu_hours"] == pytest.approx(16 * waited_h, abs=0.1)
    assert teams["a"]["inversion_gpu_hours"] == 0.0 and teams["a"]["quota_wait_gpu_hours"] == 0.0
    assert report["priority_inversion_gpu_hours"] == pytest.approx(4 * waited_h, abs=0.1)
    # While b waited, a held everything: the hours of that contention score well below 1.
    assert float(report["jain_hourly_p10"]) < 0.6  # type: ignore[arg-type]
    assert teams["b"]["share_ratio"] < 0.5 < teams["a"]["share_ratio"]


def test_a_private_cluster_reserves_for_its_biggest_gang(tmp_path: Path) -> None:
    """Team a's private cluster is one 8-GPU node. A 2-hour 1-GPU job arrives every 15
    minutes for a day, so a GPU frees exactly when the next job arrives; a 1x8 gang arrives at
    01:00. FIFO with backfill and no reservations (the old private baseline) backfilled every
    freed GPU and the gang waited for the stream to end (p99 wait 89,100 s); with switchyard's
    reservation rules it waits for the eight running jobs to finish (at most 2 h), and the jobs
    queued behind it for those 2 h and its own hour (p99 9,900 s)."""
    rows = [f"{1935446400 + 900 * n},7200,1,a,training,," for n in range(96)]  # 2031-05-02 from 00:00
    rows += ["2031-05-02T01:00:00,3600,8,a,training,,1x8", "2031-05-02T00:00:00,60,1,b,training,,"]
    spec = SimSpec(
        _trace(tmp_path, rows), gpus=16, policy=PolicyName.SWITCHYARD, teams_file=tmp_path / "teams.csv",
        inference=False, anomaly=True, tail_days=2,
    )
    report = run(spec).report
    a = report["teams"]["a"]  # type: ignore[index]
    assert a["private_cluster_gpus"] == 8
    assert a["wait_p99_private_s"] <= 3 * 3600, "the private cluster starved its gang"
    ftf = a["finish_time_fairness"]
    assert ftf["jobs"] == 97 and ftf["censored"] == 0
    assert 0.0 <= ftf["share_rho_at_most_1"] <= 1.0
    assert "rho_at_most_1_worst_team" in report
