"""Stop orders at the end of a grace period: which Ray job is stopped (the Tune-sweep rule), and
whether the workload is requeued, ended, or left for its job to come back for. No Ray."""

from __future__ import annotations

from driver_support import GRACE_S, admit, details, driver, journal, of, submission

from switchyard.scheduler.api import LeaseGrant, ReleaseOutcome, StopReason
from switchyard.scheduler.driver import Driver
from switchyard.scheduler.driver.effects import Effect, SaveState, StopClaimedJob, StopLaunchedJob
from switchyard.scheduler.driver.state import LaunchedJob


def ignored_notice(entrypoint: str | None = None, claimed_by: str | None = None) -> tuple[Driver, LeaseGrant]:
    """a0 borrows the node; b0 reclaims it at 50; a0 answers nothing."""
    d = driver({"a": 0, "b": 8})
    d.submit(submission("a0", "a", 8, entrypoint=entrypoint), 0)
    d.tick(0)
    if entrypoint is not None:
        d.job_launched("a0", "a0-1")
    if claimed_by is not None:
        d.claim("a0", claimed_by)
    grant = d.lease("a0")
    assert grant is not None
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    assert d.notice("a0") is not None
    return d, grant


def grace_over(d: Driver) -> list[Effect]:
    effects = d.tick(50 + GRACE_S)
    assert details(effects, "stop_order", "a0") == {"reason": "grace period over"}
    return effects


def test_a_launched_job_is_stopped_and_its_workload_requeued_for_relaunch() -> None:
    d, grant = ignored_notice(entrypoint="run")
    effects = grace_over(d)
    stopped = StopLaunchedJob(LaunchedJob("a0", "a0-1"), "a", StopReason.GRACE_PERIOD_OVER)
    assert of(effects, StopLaunchedJob) == [stopped]
    assert journal(effects, "a0") == ["stop_order", "requeued"]
    assert details(effects, "requeued", "a0") == {"lease_id": grant.lease_id}
    assert d.lease("a0") is None and d.notice("a0") is None
    assert "a0" in d.state.launched  # launched again when readmitted
    assert grant.lease_id not in d.state.ended  # the scheduler relaunches it: no job comes back for it
    assert {p.request.workload_id for p in d.state.core.pending()} == {"a0", "b0"}
    assert d.state.queued_since["a0"] == 50 + GRACE_S
    d.tick(50 + GRACE_S + 1)
    assert d.lease("b0") is not None  # the preemptor has the GPUs


def test_a_job_that_claimed_its_lease_itself_is_stopped_and_its_workload_ends() -> None:
    d, grant = ignored_notice(claimed_by="raysubmit_direct")
    effects = grace_over(d)
    assert of(effects, StopClaimedJob) == [StopClaimedJob("a0", "raysubmit_direct", "a", StopReason.GRACE_PERIOD_OVER)]
    assert journal(effects, "a0") == ["stop_order", "released"]  # nothing could come back for it
    assert d.state.core.pending_count() == 1 and d.state.core.lease_of("a0") is None  # only b0 waits
    assert "a0" not in d.state.claims and grant.lease_id not in d.state.ended


def test_one_trial_of_a_tune_sweep_does_not_stop_the_sweep() -> None:
    """A sweep's trials share their driver's Ray job: stopping that job for one trial would end
    the sweep. The trial's lease ends anyway; what the job still holds, the audit reports."""
    d = driver({"a": 4, "b": 4})
    for trial in ("t1", "t2"):
        admit(d, submission(trial, "a", 4), 0)
        d.claim(trial, "sweep-driver")
    d.submit(submission("b0", "b", 4, "exploratory"), 50)
    d.tick(50)
    [victim] = [t for t in ("t1", "t2") if d.notice(t) is not None]  # the one borrowing b's guarantee
    [other] = {"t1", "t2"} - {victim}
    lease_id = d.state.grants[victim].lease_id
    effects = d.tick(50 + GRACE_S)
    assert not of(effects, StopClaimedJob) and not of(effects, StopLaunchedJob)
    assert journal(effects, victim) == ["stop_order", "requeued"]
    assert d.state.ended == {lease_id: victim}  # the trial releases it when it notices
    assert d.state.claims == {other: "sweep-driver"}


def test_a_sweep_whose_last_claimed_trial_is_stopped_is_stopped() -> None:
    d = driver({"a": 0, "b": 8})
    admit(d, submission("t1", "a", 8), 0)
    d.claim("t1", "sweep-driver")
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    effects = d.tick(50 + GRACE_S)
    assert of(effects, StopClaimedJob) == [StopClaimedJob("t1", "sweep-driver", "a", StopReason.GRACE_PERIOD_OVER)]


def test_an_ended_lease_released_unfinished_keeps_its_workload_queued() -> None:
    """A job that polled for its lease and never claimed it (so it cannot be stopped): the lease
    ends and the workload waits; the job, releasing, says it will come back for it."""
    d, grant = ignored_notice()
    effects = grace_over(d)
    assert not of(effects, StopClaimedJob) and not of(effects, StopLaunchedJob)
    assert journal(effects, "a0") == ["stop_order", "requeued"]
    assert d.state.ended == {grant.lease_id: "a0"}
    outcome, released = d.release(grant.lease_id, False, 200)
    assert outcome is ReleaseOutcome.REQUEUED and released == [SaveState()]
    assert d.state.ended == {} and "a0" in {p.request.workload_id for p in d.state.core.pending()}


def test_an_ended_lease_released_finished_withdraws_its_queued_workload() -> None:
    d, grant = ignored_notice()
    grace_over(d)
    outcome, released = d.release(grant.lease_id, True, 200)
    assert outcome is ReleaseOutcome.RELEASED
    assert journal(released, "a0") == ["cancelled"]
    assert details(released, "cancelled", "a0") == {"reason": "its job finished after the scheduler ended its lease"}
    assert "a0" not in {p.request.workload_id for p in d.state.core.pending()} and "a0" not in d.state.queued_since
    assert d.release(grant.lease_id, False, 201) == (ReleaseOutcome.RELEASED, [])  # a repeat: the first answer


def test_an_ended_lease_released_finished_after_readmission_stops_the_new_grant() -> None:
    d, grant = ignored_notice()
    grace_over(d)
    d.tick(51 + GRACE_S)
    d.release(d.state.grants["b0"].lease_id, True, 60 + GRACE_S)  # b0 done: a0 is admitted again
    d.tick(61 + GRACE_S)
    again = d.lease("a0")
    assert again is not None and again.lease_id != grant.lease_id
    _, released = d.release(grant.lease_id, True, 62 + GRACE_S)
    assert journal(released, "a0") == ["cancelled"] and d.lease("a0") == again  # stopped on the next tick
    effects = d.tick(63 + GRACE_S)
    assert details(effects, "stop_order", "a0") == {"reason": "cancelled"}
    assert journal(effects, "a0") == ["stop_order", "released"] and d.lease("a0") is None
