"""The driver's submissions, admissions, notices and cancels: state, journal and effects, no Ray."""

from __future__ import annotations

import pytest
from driver_support import GRACE_S, admit, details, driver, journal, of, submission

from switchyard.scheduler.api import Placement, StopReason
from switchyard.scheduler.driver.effects import (
    ClearNotice,
    LaunchJob,
    RecordAdmission,
    RecordPreemption,
    SaveState,
    SendNotice,
    StopClaimedJob,
    StopLaunchedJob,
    split,
)
from switchyard.scheduler.driver.state import LaunchedJob
from switchyard.scheduler.preemption_channel import PreemptionNotice


def test_an_admission_grants_the_chosen_nodes_and_journals_the_wait() -> None:
    d = driver({"a": 8}, node_count=2)
    sub = submission("j", "a", 8)
    submitted = d.submit(sub, 10)
    assert submitted[0] == SaveState() and journal(submitted) == ["submitted"]
    assert details(submitted, "submitted", "j") == {"gpus": 8, "priority_class": "training"}
    assert d.lease("j") is None  # admission is the tick's

    effects = d.tick(40)
    grant = d.lease("j")
    assert grant is not None and grant.granted_at == 40 and grant.team == "a"
    [placement] = grant.placements
    assert placement == Placement(node_id=placement.node_id, node_group="g0", gpus=8)  # n0 and n1 are in g0
    assert journal(effects) == ["admitted"]
    admitted = details(effects, "admitted", "j")
    assert admitted == {"lease_id": grant.lease_id, "waited_s": 30.0, "nodes": [placement.node_id]}
    assert of(effects, RecordAdmission) == [RecordAdmission("a", "training", 8, 30.0)]
    assert of(effects, ClearNotice) == [ClearNotice("j")]  # a requeued job's last notice must go
    assert SaveState() in effects and not of(effects, LaunchJob)  # its job polls for the lease itself
    assert d.state.attempts["j"] == 1 and "j" not in d.state.queued_since
    assert d.tick(41) == []  # nothing decided, nothing changed: not even a save


def test_a_workload_with_an_entrypoint_is_launched_as_its_attempt() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="python -m train"), 0)
    [launch] = of(d.tick(0), LaunchJob)
    grant = d.lease("j")
    assert grant is not None
    assert launch == LaunchJob("j", grant.lease_id, 1, "python -m train", None)
    assert d.job_launched("j", "j-1") == [SaveState()]
    assert d.state.launched["j"] == LaunchedJob("j", "j-1")


def test_a_duplicate_submission_is_refused_and_changes_nothing() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 4), 0)
    before = dict(d.state.queued_since)
    with pytest.raises(ValueError, match="already submitted"):
        d.submit(submission("j", "a", 2), 5)
    assert d.state.queued_since == before and d.state.submissions["j"].bundles == (4,)


def test_a_preemption_notice_is_kept_sent_counted_and_journaled() -> None:
    d = driver({"a": 0, "b": 8})
    grant = admit(d, submission("a0", "a", 8), 0)  # borrows all of b's guarantee
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    effects = d.tick(50)
    notice = d.notice("a0")
    assert notice == PreemptionNotice("a0", "reclaim for b0", 50 + GRACE_S, sent_at=50, lease_id=grant.lease_id)
    assert of(effects, SendNotice) == [SendNotice(notice)]
    [counted] = of(effects, RecordPreemption)
    assert (counted.team, counted.reason, counted.lost_gpu_s) == ("a", "reclaim", 8 * 50)
    noticed = details(effects, "preemption_notice", "a0")
    assert noticed == {"reason": "reclaim for b0", "preemptor": "b0", "lost_gpu_s": 400.0}


def test_decisions_are_shown_before_they_are_applied() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8), 0)
    seen: list[tuple[list[str], bool]] = []
    d.tick(0, lambda decisions: seen.append(([s.workload_id for s in decisions.starts], d.lease("j") is None)))
    assert seen == [(["j"], True)] and d.lease("j") is not None


def test_cluster_actions_come_out_in_carry_out_order() -> None:
    """Old notices are cleared before new ones go out; stops come before launches."""
    notice = PreemptionNotice("w", "r", 1.0, sent_at=0.0, lease_id="l")
    launch = LaunchJob("w", "l", 1, "e", None)
    stop = StopLaunchedJob(LaunchedJob("v", "v-1"), "t", StopReason.CANCELLED)
    claimed = StopClaimedJob("u", "job", "t", StopReason.CANCELLED)
    books, actions = split([launch, SaveState(), claimed, stop, SendNotice(notice), ClearNotice("w")])
    assert books == [SaveState()]
    assert actions == [ClearNotice("w"), SendNotice(notice), stop, claimed, launch]


def test_checkpoints_count_only_for_a_lease_and_resumes_are_journaled() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8), 0)
    assert d.checkpoint_reported("j", 5) == []  # queued: nothing to count against
    d.tick(10)
    assert d.checkpoint_reported("j", 20) == [SaveState()]
    assert d.state.core.lease_of("j").last_checkpoint_at == 20  # type: ignore[union-attr]
    resumed = d.resume_reported("j", 7, "s3://ck/7", 30)
    assert journal(resumed) == ["resumed"]
    assert details(resumed, "resumed", "j") == {"step": 7, "checkpoint": "s3://ck/7"}
    assert resumed[0].team == "a" and SaveState() not in resumed  # type: ignore[union-attr]


def test_a_queued_workload_cancelled_is_withdrawn_at_once() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 16), 0)  # never fits
    effects = d.cancel("j", 5)
    assert effects[0] == SaveState() and journal(effects) == ["cancelled"]
    assert "j" not in d.state.queued_since and d.state.core.pending_count() == 0
    assert "j" in d.state.submissions  # still listed, as done
    with pytest.raises(KeyError):
        d.cancel("nobody", 5)


def test_a_running_launched_workload_cancelled_is_stopped_and_released() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    d.tick(0)
    d.job_launched("j", "j-1")
    grant = d.lease("j")
    assert grant is not None
    d.cancel("j", 10)
    assert d.lease("j") is not None  # the stop order comes with the next tick
    effects = d.tick(11)
    assert of(effects, StopLaunchedJob) == [StopLaunchedJob(LaunchedJob("j", "j-1"), "a", StopReason.CANCELLED)]
    assert journal(effects, "j") == ["stop_order", "released"]
    assert details(effects, "stop_order", "j") == {"reason": "cancelled"}
    assert d.lease("j") is None and "j" not in d.state.launched and d.state.core.lease_of("j") is None
    assert d.state.core.pool.free_gpus == 8
