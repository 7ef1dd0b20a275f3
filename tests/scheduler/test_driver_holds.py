"""Grants held against Serve, and a grant whose hold could not form (Ray gave its GPUs to a
Serve replica first): which grants the adapter holds, and the displacement rule. No Ray."""

from __future__ import annotations

from driver_support import details, driver, journal, of, submission

from switchyard.scheduler.api import StopReason
from switchyard.scheduler.driver import inputs, views
from switchyard.scheduler.driver.effects import Diagnostic, LaunchJob, SaveState, StopLaunchedJob


def test_every_grant_but_those_of_serve_replicas_is_held() -> None:
    d = driver({"a": 8, "serve": 8}, node_count=2)
    subs = (
        submission("train", "a", 6),
        submission("serve:app/model/r1", "serve", 2, priority="production-inference"),
        submission("batch-inference", "serve", 2, priority="production-inference"),
    )
    for sub in subs:
        d.submit(sub, 0)
    d.tick(0)
    train, replica, batch = (d.lease(s.workload_id) for s in subs)
    assert train is not None and replica is not None and batch is not None

    def is_replica(workload: str) -> bool:
        return workload.startswith("serve:")

    held = views.held_grants(d.state, is_replica)
    assert held == {g.lease_id: tuple((p.node_id, p.gpus) for p in g.placements) for g in (train, batch)}
    d.release(train.lease_id, finished=True, now=1)
    assert views.held_grants(d.state, is_replica).keys() == {batch.lease_id}


def test_a_displaced_grant_goes_back_and_the_workload_is_queued_again_without_a_strike() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="python train.py"), 0)
    [launch] = of(d.tick(0), LaunchJob)
    d.job_launched("j", "j-1")  # the launch went ahead before the hold was seen to fail
    effects = d.grant_displaced("j", launch.lease_id, "a Serve replica took them", 1)
    assert effects[0] == SaveState() and journal(effects, "j") == ["grant_displaced", "requeued"]
    assert details(effects, "requeued", "j") == {"lease_id": launch.lease_id, "reason": "grant_displaced"}
    [stop] = of(effects, StopLaunchedJob)
    assert stop.job.submission_id == "j-1" and stop.reason is StopReason.GRANT_DISPLACED
    assert d.lease("j") is None and d.state.core.pool.free_gpus == 8
    assert d.state.claim_timeouts == {} and "j" not in d.state.launched
    assert [p.request.workload_id for p in d.state.core.pending()] == ["j"]
    # Its next admission is a new attempt, launched as a new Ray job.
    [again] = of(d.tick(2), LaunchJob)
    assert again.lease_id != launch.lease_id and again.attempt == 2


def test_a_claimed_grant_is_kept_and_a_stale_one_ignored() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8), 0)
    d.tick(0)
    grant = d.lease("j")
    assert grant is not None
    d.claim("j", "ray-job")
    [kept] = d.grant_displaced("j", grant.lease_id, "late", 1)
    assert isinstance(kept, Diagnostic) and "claimed already" in kept.message
    assert d.lease("j") == grant
    [stale] = d.grant_displaced("j", "wl-old#1", "late", 1)
    assert isinstance(stale, Diagnostic) and "ended since" in stale.message


def test_a_displacement_is_a_logged_event_that_replays() -> None:
    live, replayed = driver({"a": 8}), driver({"a": 8})
    records = [inputs.submit(submission("j", "a", 8), 0, None), inputs.tick(0)]
    for record in records:
        inputs.apply(live, record)
        inputs.apply(replayed, record)
    grant = live.lease("j")
    assert grant is not None
    record = inputs.grant_displaced("j", grant.lease_id, "a Serve replica took them", 1)
    _, effects = inputs.apply(live, record)
    assert journal(effects) == ["grant_displaced", "requeued"]
    inputs.apply(replayed, record)
    assert replayed.lease("j") is None
    assert [p.request.workload_id for p in replayed.state.core.pending()] == ["j"]
