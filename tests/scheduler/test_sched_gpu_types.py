"""GPU types as resource flavors: nodes carry a type, quotas are per type, and a request
that lists several types takes the first that fits (Kueue's flavor fungibility)."""

from __future__ import annotations

import pytest

from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    GangRequest,
    Node,
    PolicyKnobs,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.core.policy import WhenCanBorrow

TRAINING = frozenset({WorkloadClass.TRAINING})
INFERENCE = frozenset({WorkloadClass.INFERENCE})


def typed_nodes(per_type: int = 2) -> list[Node]:
    """`per_type` 8-GPU nodes of each type, one node group per type."""
    return [Node(f"{t}-{i}", 8, f"group-{t}", f"rack-{t}", t) for t in ("h100", "a100") for i in range(per_type)]


def two_type_policy(quotas: dict[str, tuple[int, int | None]], knobs: PolicyKnobs | None = None) -> SchedulerPolicy:
    """Team `a`'s training quota per type: (guarantee, borrowing limit)."""
    entries = tuple(Quota(TRAINING, g, limit, None, t) for t, (g, limit) in quotas.items())
    inference = Team("inf", (Quota(INFERENCE, 8, 0, None, "h100"),), 8.0)
    return SchedulerPolicy(
        DEFAULT_PRIORITY_CLASSES,
        (Team("a", entries, 8.0), inference),
        knobs or PolicyKnobs(),
        gpu_types=("h100", "a100"),
    )


def train(wid: str, gpus: int, types: tuple[str, ...] = (), team: str = "a") -> GangRequest:
    return GangRequest(wid, team, WorkloadClass.TRAINING, "training", (gpus,), gpu_types=types)


def test_an_ordered_type_list_falls_back_to_its_second_choice() -> None:
    s = Scheduler(two_type_policy({"h100": (16, 0), "a100": (16, 0)}), typed_nodes())
    for i in range(3):
        s.submit(train(f"j{i}", 8, ("h100", "a100")), 0.0)
    d = s.schedule(0.0)
    types = {start.workload_id: start.gpu_type for start in d.starts}
    assert types == {"j0": "h100", "j1": "h100", "j2": "a100"}  # h100 full: the second choice
    j2 = s.lease_of("j2")
    assert j2 is not None and all(s.pool.node(n).gpu_type == "a100" for n in j2.placement)


def test_a_request_for_a_full_type_does_not_block_one_for_another() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0), "a100": (8, 0)}), typed_nodes(per_type=1))
    s.submit(train("h0", 8, ("h100",)), 0.0)
    s.schedule(0.0)
    s.submit(train("h1", 8, ("h100",)), 1.0)  # same team, class and shape: queued first
    s.submit(train("a0", 8, ("a100",)), 2.0)
    assert [x.workload_id for x in s.schedule(2.0).starts] == ["a0"]


def test_a_request_naming_no_type_tries_the_policys_order() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0), "a100": (8, 0)}), typed_nodes())
    s.submit(train("j0", 8), 0.0)
    s.submit(train("j1", 8), 0.0)
    assert [x.gpu_type for x in s.schedule(0.0).starts] == ["h100", "a100"]


def test_per_type_quota_holds_even_when_the_other_type_is_idle() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0), "a100": (16, 0)}), typed_nodes())
    s.submit(train("j0", 8, ("h100",)), 0.0)
    s.submit(train("j1", 8, ("h100",)), 0.0)
    assert [x.workload_id for x in s.schedule(0.0).starts] == ["j0"]
    (row,) = s.snapshot(1.0).pending
    assert row.workload_id == "j1"
    assert row.reason == "quota" and "h100" in row.detail and "borrowing limit" in row.detail


def test_kueue_default_borrows_in_the_first_type_before_trying_the_next() -> None:
    # whenCanBorrow: Borrow (Kueue's default): h100 lets `a` borrow, so it takes h100.
    quotas: dict[str, tuple[int, int | None]] = {"h100": (0, None), "a100": (8, 0)}
    s = Scheduler(two_type_policy(quotas), typed_nodes())
    s.submit(train("j0", 8, ("h100", "a100")), 0.0)
    (start,) = s.schedule(0.0).starts
    assert (start.gpu_type, start.borrowing) == ("h100", True)
    # whenCanBorrow: TryNextFlavor: the a100 guarantee first.
    knobs = PolicyKnobs(when_can_borrow=WhenCanBorrow.TRY_NEXT_TYPE)
    s = Scheduler(two_type_policy(quotas, knobs), typed_nodes())
    s.submit(train("j0", 8, ("h100", "a100")), 0.0)
    (start,) = s.schedule(0.0).starts
    assert (start.gpu_type, start.borrowing) == ("a100", False)


def test_pending_reason_names_each_type() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0), "a100": (8, 0)}), typed_nodes(per_type=1))
    s.submit(train("big", 16, ("h100", "a100")), 0.0)
    s.schedule(0.0)
    (row,) = s.snapshot(1.0).pending
    assert row.reason == "quota"
    assert row.detail.startswith("h100: quota (") and "; a100: quota (" in row.detail


def test_capacity_reason_counts_free_gpus_of_the_type_only() -> None:
    s = Scheduler(two_type_policy({"h100": (16, None), "a100": (16, None)}), typed_nodes(per_type=1))
    s.submit(train("h", 8, ("h100",)), 0.0)
    s.schedule(0.0)
    s.submit(train("more", 8, ("h100",)), 1.0)
    (row,) = s.snapshot(1.0).pending
    assert row.reason == "capacity" and "h100: capacity (needs 8 GPUs, 0 free)" in row.detail


def test_reclaim_preempts_only_on_the_type_it_needs() -> None:
    s = Scheduler(two_type_policy({"h100": (0, None), "a100": (0, None)}), typed_nodes(per_type=1))
    s.submit(train("on-h100", 8, ("h100",)), 0.0)
    s.submit(train("on-a100", 8, ("a100",)), 0.0)
    assert len(s.schedule(0.0).starts) == 2
    s.submit(GangRequest("replica", "inf", WorkloadClass.INFERENCE, "production-inference", (8,)), 10.0)
    d = s.schedule(10.0)
    assert [n.workload_id for n in d.notices] == ["on-h100"]  # inference's quota is of h100


def test_requests_naming_bad_types_are_refused() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0)}), typed_nodes())
    with pytest.raises(ValueError, match="unknown GPU types"):
        s.submit(train("x", 1, ("v100",)), 0.0)
    with pytest.raises(ValueError, match="no quota for workload class training of GPU types"):
        s.submit(train("y", 1, ("a100",)), 0.0)
    flat = SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, (Team("a", (Quota(TRAINING, 8),)),))
    with pytest.raises(ValueError, match="the policy declares none"):
        Scheduler(flat, []).submit(train("z", 1, ("h100",)), 0.0)


def test_a_node_group_has_one_type() -> None:
    with pytest.raises(ValueError, match="node group 'g' is 'h100'"):
        Scheduler(two_type_policy({"h100": (8, 0)}), [Node("n0", 8, "g", "r", "h100"), Node("n1", 8, "g", "r", "a100")])


def test_adopt_charges_the_type_of_its_nodes() -> None:
    s = Scheduler(two_type_policy({"h100": (8, 0), "a100": (8, 0)}), typed_nodes(per_type=1))
    start = s.adopt(train("ray-placed", 8), ("a100-0",), 0.0)
    assert start.gpu_type == "a100"
    s.submit(train("next", 8, ("a100",)), 1.0)
    assert not s.schedule(1.0).starts  # a100's guarantee is used; h100's is not borrowed for it
