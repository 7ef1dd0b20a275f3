"""A launched job that ends while it holds its claimed lease (a crash, or a release lost with the
process): the scheduler releases the lease on its behalf. No Ray.

Found by the randomized live fault test (`tests/scheduler_live/test_live_faults.py`, seed 1):
such a lease stayed `running`, holding its GPUs, until someone cancelled the workload."""

from __future__ import annotations

import pytest
from driver_support import details, driver, journal, of, submission

from switchyard.scheduler.driver import Driver, inputs, views
from switchyard.scheduler.driver.effects import LaunchJob
from switchyard.scheduler.driver.state import LaunchedJob


def launched_and_claimed(d: Driver, wid: str, now: float) -> LaunchJob:
    d.submit(submission(wid, "a", 8, entrypoint="python train.py"), now)
    [launch] = of(d.tick(now), LaunchJob)
    d.job_launched(wid, f"{wid}-{launch.attempt}")
    d.claim(wid, "raylet-job-1")
    return launch


def test_a_crashed_job_gives_its_lease_back_and_the_workload_is_over() -> None:
    d = driver({"a": 8})
    launch = launched_and_claimed(d, "j", 0)
    assert views.launched_jobs_on_claimed_leases(d.state) == {"j-1": "j"}
    effects = d.job_exited("j", "j-1", "FAILED", 5)
    assert journal(effects, "j") == ["job_exited", "released"]
    assert details(effects, "job_exited", "j") == {"lease_id": launch.lease_id, "ray_job": "j-1", "status": "FAILED"}
    assert d.lease("j") is None and d.state.core.pool.free_gpus == 8 and d.state.core.pending_count() == 0
    # The job's own release, arriving late, gets the same answer: over, not requeued.
    assert d.release(launch.lease_id, finished=False, now=6)[1] == []
    assert views.launched_jobs_on_claimed_leases(d.state) == {}


def test_a_job_that_exits_under_a_notice_is_requeued_and_launched_again() -> None:
    d = driver({"a": 0, "b": 8})  # a borrows all of b's guarantee
    launch = launched_and_claimed(d, "j", 0)
    d.submit(submission("owner", "b", 8), 1)
    d.tick(1)
    assert d.notice("j") is not None
    effects = d.job_exited("j", "j-1", "STOPPED", 2)
    assert journal(effects, "j") == ["job_exited", "requeued"]
    d.tick(2)  # the freed GPUs go to the owner; the workload waits for its next admission
    assert d.lease("owner") is not None and [p.request.workload_id for p in d.state.core.pending()] == ["j"]
    d.release(d.lease("owner").lease_id, finished=True, now=3)  # type: ignore[union-attr]
    [again] = of(d.tick(3), LaunchJob)
    assert again.workload_id == "j" and again.lease_id != launch.lease_id


def _relaunched() -> tuple[Driver, LaunchJob, LaunchJob]:
    """Workload j launched as j-1, never claimed, taken back, and launched again as j-2."""
    d = driver({"a": 8}, claim_timeout_s=10)
    d.submit(submission("j", "a", 8, entrypoint="python train.py"), 0)
    [first] = of(d.tick(0), LaunchJob)
    d.job_launched("j", "j-1")
    d.tick(11)  # never claimed: taken back and requeued
    [second] = of(d.tick(12), LaunchJob)
    assert second.attempt == 2 and "j" not in d.state.launched  # the old job is not this lease's
    d.job_launched("j", "j-2")
    return d, first, second


def test_a_job_of_an_earlier_attempt_ending_leaves_the_current_lease_alone() -> None:
    d, first, second = _relaunched()
    d.claim("j", "raylet-job-2")
    assert d.job_exited("j", "j-1", "STOPPED", 13) == []  # the first attempt's job, stopped
    assert d.lease("j") is not None and d.lease("j").lease_id == second.lease_id  # type: ignore[union-attr]
    assert first.lease_id != second.lease_id


def test_an_unclaimed_grant_is_the_claim_timeouts_and_a_released_one_is_done() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="python train.py"), 0)
    [launch] = of(d.tick(0), LaunchJob)
    d.state.launched["j"] = LaunchedJob("j", "j-1")
    assert d.job_exited("j", "j-1", "FAILED", 1) == []  # a lost launch: the claim timeout's to count
    d.claim("j", "raylet-job-1")
    d.release(launch.lease_id, finished=True, now=2)
    assert d.job_exited("j", "j-1", "SUCCEEDED", 3) == []  # it released first, as jobs do


def test_a_job_exit_is_a_logged_event_that_replays() -> None:
    live, replayed = driver({"a": 8}), driver({"a": 8})
    sub = submission("j", "a", 8, entrypoint="python train.py")
    records = [inputs.submit(sub, 0, None), inputs.tick(0), inputs.job_launched("j", "j-1"), inputs.claim("j", "r")]
    records.append(inputs.job_exited("j", "j-1", "FAILED", 5))
    for record in records:
        inputs.apply(live, record)
        inputs.apply(replayed, record)
    assert live.lease("j") is None and replayed.lease("j") is None
    assert replayed.state.finished_at.keys() == {"j"}


def test_a_job_of_an_earlier_attempt_cannot_claim_the_current_lease() -> None:
    """Stop 47: an attempt that started after its grant was taken back (its launch was slow,
    or reported lost) claimed the workload's current lease, which its next attempt was using:
    the claim moved to it, and the two jobs ran on the same GPUs. A launched job now names the
    lease it was launched for, and a lease another Ray job claimed is not claimed again."""
    d, first, second = _relaunched()
    grant, _ = d.claim("j", "raylet-job-2", second.lease_id)
    assert grant is not None and grant.lease_id == second.lease_id
    with pytest.raises(ValueError, match=f"launched for lease {first.lease_id}, which is over"):
        d.claim("j", "raylet-job-1", first.lease_id)  # the first attempt, late
    with pytest.raises(ValueError, match="is claimed by Ray job raylet-job-2"):
        d.claim("j", "raylet-job-3")  # a job started by hand with the workload's id
    assert d.state.claims["j"] == "raylet-job-2"
    assert d.claim("j", "raylet-job-2", second.lease_id) == (grant, [])  # a retried claim: answered
