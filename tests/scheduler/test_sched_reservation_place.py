"""Where a reservation sits: work that may pass it keeps off it while anything else fits, and
a blocked gang's reservation moves once other nodes would gather `reservation_move_gpus` more
free GPUs than its own."""

from __future__ import annotations

import dataclasses

from sched_support import gang, nodes, policy

from switchyard.scheduler.core import PolicyKnobs, PreemptionMode, Scheduler

KNOBS = PolicyKnobs(preemption=PreemptionMode.NONE, enforce_quota=False, max_reservations=1)


def _reserved(s: Scheduler, now: float) -> dict[str, int]:
    (reservation,) = s.schedule(now).reservations
    assert reservation.workload_id == "big"
    return dict(reservation.gpus_by_node)


def test_higher_priority_work_passes_a_reservation_only_where_nothing_else_fits() -> None:
    s = Scheduler(policy({"a": 24}, KNOBS), nodes(3, per_group=3))
    s.adopt(gang("w0", "a", (2,)), ("n0",), 0)
    s.adopt(gang("w1", "a", (6,)), ("n1",), 0)
    s.adopt(gang("w2", "a", (6,)), ("n2",), 0)
    s.submit(gang("big", "a", (8, 8), "training", same_group=True), 1)
    reserved = _reserved(s, 1)  # n0 and one of the nodes with 2 GPUs free
    (spare,) = {"n1", "n2"} - set(reserved)
    s.submit(gang("inf", "a", (2,), "production-inference"), 2)
    (start,) = s.schedule(2).starts
    # A 2-GPU node that nothing holds fits it: the reserved 2 GPUs, as tight a fit, stay held.
    assert start.placement == (spare,)
    s.submit(gang("inf2", "a", (2,), "production-inference"), 3)
    (start,) = s.schedule(3).starts
    assert start.placement[0] in reserved  # now only held GPUs fit: higher priority still passes


def test_a_reservation_moves_once_other_nodes_would_gather_enough_more() -> None:
    knobs = dataclasses.replace(KNOBS, reservation_move_gpus=8)
    s = Scheduler(policy({"a": 40}, knobs), nodes(5, per_group=5))
    for i, used in enumerate((6, 6, 6, 7, 7)):
        s.adopt(gang(f"w{i}", "a", (used,)), (f"n{i}",), 0)
    s.submit(gang("big", "a", (8, 8, 8), "training", same_group=True), 1)
    assert set(_reserved(s, 1)) == {"n0", "n1", "n2"}  # 6 GPUs gathered
    s.release(s.lease_of("w3").lease_id, 2, finished=True)
    # n3 and two held nodes would gather 12: fewer than 8 more than its 6, so it stays.
    assert set(_reserved(s, 2)) == {"n0", "n1", "n2"}
    s.release(s.lease_of("w4").lease_id, 3, finished=True)
    # n3 and n4 hold 16 free GPUs; with one held node 18 (still short of 24): it moves there,
    # so backfill cannot take the two free nodes.
    moved = _reserved(s, 3)
    assert {"n3", "n4"} <= set(moved) and sum(moved.values()) == 24
    s.submit(gang("filler", "a", (4,)), 4)
    assert all(node not in ("n3", "n4") for start in s.schedule(4).starts for node in start.placement)


def test_a_reservation_stays_put_when_moves_are_off() -> None:
    knobs = dataclasses.replace(KNOBS, reservation_move_gpus=None)
    s = Scheduler(policy({"a": 40}, knobs), nodes(5, per_group=5))
    for i, used in enumerate((6, 6, 6, 7, 7)):
        s.adopt(gang(f"w{i}", "a", (used,)), (f"n{i}",), 0)
    s.submit(gang("big", "a", (8, 8, 8), "training", same_group=True), 1)
    assert set(_reserved(s, 1)) == {"n0", "n1", "n2"}
    for i, name in ((3, "w3"), (4, "w4")):
        s.release(s.lease_of(name).lease_id, 1 + i, finished=True)
        assert set(_reserved(s, 1 + i)) == {"n0", "n1", "n2"}
