"""Which queued gangs the autoscaler is asked to make room for, and the request itself."""

from __future__ import annotations

from dataclasses import replace

from sched_support import ALL_CLASSES, gang, nodes

from switchyard.cluster.autoscale import NODE_GROUP_LABEL, CapacityRequest, capacity_request
from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    PolicyKnobs,
    PreemptionMode,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
)


def two_teams(knobs: PolicyKnobs) -> SchedulerPolicy:
    """a: 8 guaranteed, may borrow; b: 8 guaranteed, may not borrow at all."""
    teams = (
        Team("a", (Quota(ALL_CLASSES, 8),), 8.0),
        Team("b", (Quota(ALL_CLASSES, 8, borrowing_limit_gpus=0),), 8.0),
    )
    return SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, teams, knobs)


def test_gangs_short_of_capacity_are_waiting_those_over_quota_are_not() -> None:
    s = Scheduler(two_teams(PolicyKnobs(preemption=PreemptionMode.NONE)), nodes(2))
    s.submit(gang("a-run", "a", (8,)), 0)
    s.submit(gang("b-run", "b", (8,)), 0)
    assert len(s.schedule(0).starts) == 2  # the cluster is full
    s.submit(gang("a-big", "a", (4, 4)), 1)  # borrowing, refused only for lack of lendable GPUs
    s.submit(gang("b-over", "b", (2,)), 1)  # over b's guarantee, and b may not borrow
    assert not s.schedule(1).starts
    assert [g.workload_id for g in s.waiting_for_capacity()] == ["a-big"]
    # More GPUs lift the first refusal, not the second.
    s.add_node(nodes(3)[2], 2)
    assert [x.workload_id for x in s.schedule(2).starts] == ["a-big"]
    assert s.waiting_for_capacity() == []


def test_a_preemptor_waiting_for_its_victims_is_not_waiting_for_capacity() -> None:
    s = Scheduler(two_teams(PolicyKnobs()), nodes(2))
    for i in range(4):
        s.submit(gang(f"a{i}", "a", (4,), "training"), 0)
    assert len(s.schedule(0).starts) == 4  # a borrows b's idle guarantee
    s.submit(gang("b-own", "b", (8,), "training"), 10)
    assert s.schedule(10).notices  # b reclaims: a's borrowers are noticed
    assert s.waiting_for_capacity() == []


def test_request_covers_leases_plus_waiting_gangs_and_clears_when_none_wait() -> None:
    waiting = [gang("w2", "a", (8, 8)), replace(gang("w1", "a", (2,)), node_group="g1")]
    request = capacity_request([(4,), (8,)], waiting)
    # Ray sizes the cluster for the request alone, so the leases' GPUs are part of it.
    assert request.bundles == ({"GPU": 4.0}, {"GPU": 8.0}, {"GPU": 2.0}, {"GPU": 8.0}, {"GPU": 8.0})
    assert request.label_selectors == ({}, {}, {NODE_GROUP_LABEL: "g1"}, {}, {})
    assert capacity_request([(4,), (8,)], list(reversed(waiting))) == request  # stable: no churn
    cleared = capacity_request([(4,), (8,)], [])
    assert cleared == CapacityRequest() and not cleared and not cleared.bundles
