"""Which queued gangs the autoscaler is asked to make room for, and the request itself."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_support import ALL_CLASSES, gang, nodes
from test_sched_gpu_types import train, two_type_policy, typed_nodes

from switchyard.cluster.autoscale import GPU_TYPE_LABEL, NODE_GROUP_LABEL, CapacityRequest, capacity_request
from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    Node,
    PolicyKnobs,
    PreemptionMode,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
)
from switchyard.scheduler.core.explain import CapacityNeed


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
    assert [(n.request.workload_id, n.gpu_type) for n in s.waiting_for_capacity()] == [("a-big", "")]
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
    waiting = [CapacityNeed(gang("w2", "a", (8, 8))), CapacityNeed(replace(gang("w1", "a", (2,)), node_group="g1"))]
    request = capacity_request([((4,), ""), ((8,), "")], waiting)
    # Ray sizes the cluster for the request alone, so the leases' GPUs are part of it.
    assert request.bundles == ({"GPU": 4.0}, {"GPU": 8.0}, {"GPU": 2.0}, {"GPU": 8.0}, {"GPU": 8.0})
    assert request.label_selectors == ({}, {}, {NODE_GROUP_LABEL: "g1"}, {}, {})
    assert capacity_request([((8,), ""), ((4,), "")], list(reversed(waiting))) == request  # stable: no churn
    cleared = capacity_request([((4,), ""), ((8,), "")], [])
    assert cleared == CapacityRequest() and not cleared and not cleared.bundles


def test_a_gang_waiting_for_a_gpu_type_asks_for_nodes_of_that_type() -> None:
    """With GPU types, each bundle carries its type: Ray would otherwise count an idle a100
    node as room for a gang that waits for h100s, and add nothing."""
    s = Scheduler(two_type_policy({"h100": (16, 0), "a100": (16, 0)}), typed_nodes(per_type=1))
    s.submit(train("h-run", 8, ("h100",)), 0)
    s.submit(train("a-run", 8, ("a100",)), 0)
    assert len(s.schedule(0).starts) == 2  # both types full
    s.submit(train("h-next", 8, ("h100",)), 1)
    s.submit(train("either", 8, ("a100", "h100")), 1)  # its first choice is a100
    assert not s.schedule(1).starts
    needs = {n.request.workload_id: n.gpu_type for n in s.waiting_for_capacity()}
    assert needs == {"h-next": "h100", "either": "a100"}
    leased = [(lease.request.bundles, lease.gpu_type) for lease in s.leases().values()]
    request = capacity_request(leased, s.waiting_for_capacity())
    assert list(zip(request.bundles, request.label_selectors, strict=True)) == [
        ({"GPU": 8.0}, {GPU_TYPE_LABEL: "a100"}),  # the leases, sorted
        ({"GPU": 8.0}, {GPU_TYPE_LABEL: "h100"}),
        ({"GPU": 8.0}, {GPU_TYPE_LABEL: "a100"}),  # "either", on its first type
        ({"GPU": 8.0}, {GPU_TYPE_LABEL: "h100"}),  # "h-next"
    ]
    s.add_node(Node("h100-extra", 8, "group-h100", "rack-h100", "h100"), 2)  # what was asked for
    s.add_node(Node("a100-extra", 8, "group-a100", "rack-a100", "a100"), 2)
    assert {x.workload_id: x.gpu_type for x in s.schedule(2).starts} == {"either": "a100", "h-next": "h100"}


def test_the_actor_reads_a_nodes_gpu_type_from_its_label(monkeypatch: pytest.MonkeyPatch) -> None:
    from switchyard.cluster import scheduler_actor

    ray_nodes = [
        {"NodeID": "n1", "Alive": True, "Resources": {"GPU": 8.0}, "Labels": {GPU_TYPE_LABEL: "h100"}},
        {"NodeID": "n2", "Alive": True, "Resources": {"GPU": 8.0}, "Labels": {NODE_GROUP_LABEL: "g2"}},
        {"NodeID": "cpu", "Alive": True, "Resources": {"CPU": 4.0}, "Labels": {}},
    ]
    monkeypatch.setattr(scheduler_actor.ray, "nodes", lambda: ray_nodes)
    assert scheduler_actor.cluster_gpu_nodes() == [
        Node("n1", 8, "default", "default", "h100"),
        Node("n2", 8, "g2", "default", ""),
    ]
