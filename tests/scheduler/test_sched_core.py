"""The scheduler core's event API: quotas, borrowing, reservations, two-phase preemption."""

from __future__ import annotations

import pytest
from sched_support import gang, nodes, policy

from switchyard.scheduler.core import (
    LeaseState,
    Ordering,
    PolicyKnobs,
    PreemptionMode,
    PreemptionReason,
    Scheduler,
)


def test_submit_schedule_release_round_trip() -> None:
    s = Scheduler(policy({"a": 8}), nodes(1))
    s.submit(gang("j", "a", (4,)), 0)
    d = s.schedule(0)
    assert [x.workload_id for x in d.starts] == ["j"]
    assert s.pool.free_gpus == 4
    assert s.release(d.starts[0].lease_id, 10, finished=True) is False
    assert s.pool.free_gpus == 8
    assert not s.schedule(10)


def test_bad_requests_name_the_problem() -> None:
    s = Scheduler(policy({"a": 8}), nodes(1))
    with pytest.raises(ValueError, match="unknown team 'zz'"):
        s.submit(gang("j", "zz", (1,)), 0)
    with pytest.raises(ValueError, match="bundles must be positive"):
        s.submit(gang("j", "a", (0,)), 0)
    s.submit(gang("j", "a", (1,)), 0)
    with pytest.raises(ValueError, match="already submitted"):
        s.submit(gang("j", "a", (1,)), 0)
    with pytest.raises(KeyError):
        s.cancel("nope", 0)


def test_a_borrowing_gang_larger_than_what_it_borrowed_is_reclaimed_whole() -> None:
    """Found by the demo: a 6-GPU job of a team with a 2-GPU guarantee borrows 4; the owner of
    those 4 must get them back although the gang cannot be split (it goes whole, leaving its
    team below its guarantee until it fits again). The rule used to protect it forever."""
    s = Scheduler(policy({"inf": 3, "res": 2, "vis": 3}), nodes(1))
    s.submit(gang("inf-0", "inf", (2,), "production-inference"), 0)
    s.submit(gang("res-0", "res", (6,), "training"), 0)
    assert len(s.schedule(0).starts) == 2  # 2 + 6 = the whole node
    s.submit(gang("inf-1", "inf", (1,), "production-inference"), 10)  # within inf's guarantee
    d = s.schedule(10)
    assert [n.workload_id for n in d.notices] == ["res-0"]
    assert d.notices[0].reason is PreemptionReason.RECLAIM
    # A team that is not borrowing stays off limits: vis's own small job is never a victim.
    s2 = Scheduler(policy({"inf": 4, "vis": 4}), nodes(1))
    s2.submit(gang("vis-0", "vis", (4,), "training"), 0)
    s2.submit(gang("inf-0", "inf", (4,), "production-inference"), 0)
    assert len(s2.schedule(0).starts) == 2
    s2.submit(gang("inf-1", "inf", (1,), "production-inference"), 1)  # over inf's guarantee
    assert not s2.schedule(1).notices


def test_non_preemptible_work_never_borrows() -> None:
    s = Scheduler(policy({"a": 4, "b": 4}), nodes(1))
    s.submit(gang("inf", "a", (6,), "production-inference"), 0)
    assert not s.schedule(0).starts  # 6 > its guarantee of 4 and it may not borrow
    s.submit(gang("exp", "a", (6,), "exploratory"), 0)
    starts = s.schedule(0).starts
    assert [x.workload_id for x in starts] == ["exp"] and starts[0].borrowing


def test_reclaim_is_two_phase_and_respects_the_guarantee() -> None:
    s = Scheduler(policy({"a": 8, "b": 8}), nodes(2))
    for i in range(4):
        s.submit(gang(f"a{i}", "a", (4,), "training"), 0)
    assert len(s.schedule(0).starts) == 4  # a borrows all of b's unused guarantee
    s.submit(gang("b0", "b", (8,), "exploratory"), 100)
    d = s.schedule(100)
    assert not d.starts
    assert len(d.notices) == 2 and {n.reason for n in d.notices} == {PreemptionReason.RECLAIM}
    victims = {n.lease_id for n in d.notices}
    # The victims still hold their GPUs; nothing else may take the freed ones.
    assert all(s.leases()[v].state is LeaseState.PREEMPTING for v in victims)
    assert s.pool.free_gpus == 0
    assert s.team_usage("a") == 16
    # a now keeps exactly its guarantee: a second reclaim finds nothing to take.
    s.submit(gang("b1", "b", (4,), "exploratory"), 101)
    assert not s.schedule(101).notices
    # Grace passes: stop orders, then the releases hand the node to b0.
    d = s.schedule(100 + PolicyKnobs().preemption_grace_s)
    assert {x.lease_id for x in d.stops} == victims
    for v in victims:
        assert s.release(v, 230) is True  # requeued
    starts = s.schedule(230).starts
    assert [x.workload_id for x in starts] == ["b0"]


def test_a_checkpoint_after_notice_does_not_end_the_lease_early() -> None:
    """The reported checkpoint may be a periodic one the job started before it saw the notice:
    its GPUs stay its own until it releases them, or until the grace period is over."""
    s = Scheduler(policy({"a": 0, "b": 8}), nodes(1))
    s.submit(gang("a0", "a", (8,), "training", checkpoint_s=600), 0)
    s.schedule(0)
    s.submit(gang("b0", "b", (8,), "exploratory"), 50)
    notice = s.schedule(50).notices[0]
    assert notice.lost_gpu_seconds == 8 * 50
    s.report_checkpoint("a0", 70)
    assert not s.schedule(70).stops and s.pool.free_gpus == 0
    assert s.leases()[notice.lease_id].lost_gpu_seconds(80) == 8 * 10  # counted from the checkpoint
    assert [x.reason for x in s.schedule(50 + PolicyKnobs().preemption_grace_s).stops] == ["grace period over"]


def test_checkpoint_aware_picks_the_victim_that_loses_least() -> None:
    # Two borrowers of equal priority: the older one checkpointed a moment ago.
    def run(mode: PreemptionMode) -> str:
        s = Scheduler(policy({"a": 0, "b": 8}, PolicyKnobs(preemption=mode)), nodes(2))
        s.submit(gang("old", "a", (8,), "training", checkpoint_s=1000), 0)
        s.schedule(0)
        s.submit(gang("new", "a", (8,), "training"), 900)
        s.schedule(900)
        s.submit(gang("b0", "b", (8,), "exploratory"), 1010)
        return s.schedule(1010).notices[0].workload_id

    assert run(PreemptionMode.CHECKPOINT_AWARE) == "old"  # loses 10 s x 8 GPUs
    assert run(PreemptionMode.KUEUE) == "new"  # most recently started, loses 110 s x 8


def test_minimum_runtime_protects_from_priority_preemption_only() -> None:
    s = Scheduler(policy({"a": 8}), nodes(1))
    s.submit(gang("batch", "a", (8,), "batch"), 0)  # min runtime 600 s
    s.schedule(0)
    s.submit(gang("train", "a", (8,), "training"), 100)
    assert not s.schedule(100).notices
    notices = s.schedule(700).notices
    assert [n.workload_id for n in notices] == ["batch"]
    assert notices[0].reason is PreemptionReason.PRIORITY


def test_reservation_blocks_backfill_on_its_nodes() -> None:
    knobs = PolicyKnobs(preemption=PreemptionMode.NONE, enforce_quota=False, max_reservations=1)
    s = Scheduler(policy({"a": 16}, knobs), nodes(2))
    s.submit(gang("small0", "a", (4,)), 0)
    s.submit(gang("small1", "a", (4,)), 0)
    s.schedule(0)  # best fit packs both onto one node
    s.submit(gang("big", "a", (8, 8), "training"), 1)
    s.submit(gang("filler", "a", (4,), "exploratory"), 2)
    d = s.schedule(2)
    assert not d.starts or all(x.workload_id != "big" for x in d.starts)
    assert [r.workload_id for r in d.reservations] == ["big"]
    # The filler did not land on the reserved node.
    reserved = dict(d.reservations[0].gpus_by_node)
    assert all(node not in reserved for x in d.starts for node in x.placement)


def test_fifo_without_backfill_blocks_behind_the_head() -> None:
    knobs = PolicyKnobs(Ordering.FIFO, PreemptionMode.NONE, enforce_quota=False, backfill=False,
                        max_reservations=0)
    s = Scheduler(policy({"a": 8}, knobs), nodes(1))
    s.submit(gang("first", "a", (6,)), 0)
    s.schedule(0)
    s.submit(gang("head", "a", (4,)), 1)
    s.submit(gang("tiny", "a", (1,)), 2)
    assert not s.schedule(2).starts


def test_fair_share_orders_teams_by_weighted_usage() -> None:
    knobs = PolicyKnobs(preemption=PreemptionMode.NONE)
    s = Scheduler(policy({"a": 4, "b": 4}, knobs), nodes(1))
    for i in range(8):
        s.submit(gang(f"a{i}", "a", (1,)), 0)
    s.schedule(0)  # a floods and takes the whole node
    for i in range(8):
        s.release(f"a{i}#1", 3600, finished=True)
    for i in range(8, 16):
        s.submit(gang(f"a{i}", "a", (1,)), 3600)
    s.submit(gang("b0", "b", (1,)), 3601)
    first = s.schedule(3601).starts[0]
    assert first.workload_id == "b0"  # b's share is lower even though it asked last


def test_remove_node_requeues_its_leases_and_snapshot_reports() -> None:
    s = Scheduler(policy({"a": 8, "b": 8}), nodes(2))
    s.submit(gang("j", "a", (8,), "training"), 0)
    s.schedule(0)
    node = s.lease_of("j")
    assert node is not None
    lost = s.remove_node(node.placement[0], 10)
    assert lost == ["j#1"] and s.pending_count() == 1
    d = s.schedule(10)
    assert [x.lease_id for x in d.starts] == ["j#2"]
    snap = s.snapshot(10)
    row = {t.team: t for t in snap.teams}["a"]
    assert (row.used_gpus, row.guaranteed_gpus, row.queued) == (8, 8, 0)
    assert snap.total_gpus == 8 and len(snap.leases) == 1


def test_cancel_running_asks_for_a_stop() -> None:
    s = Scheduler(policy({"a": 8}), nodes(1))
    s.submit(gang("j", "a", (2,)), 0)
    s.schedule(0)
    s.cancel("j", 5)
    assert [x.reason for x in s.schedule(5).stops] == ["cancelled"]


def test_a_starving_request_goes_ahead_of_fair_share() -> None:
    knobs = PolicyKnobs(preemption=PreemptionMode.NONE, starvation_after_s=3600.0,
                        max_reservations=0)
    s = Scheduler(policy({"a": 4, "b": 4}, knobs), nodes(1))
    s.submit(gang("a-run", "a", (8,)), 0)
    s.schedule(0)  # a holds the node: its share is far above b's
    s.submit(gang("a-old", "a", (1,)), 10)
    s.submit(gang("b-new", "b", (1,)), 5000)
    s.release("a-run#1", 5000, finished=True)
    order = [x.workload_id for x in s.schedule(5000).starts]
    assert order == ["a-old", "b-new"]  # a-old waited past an hour; without aging b goes first
    s2 = Scheduler(policy({"a": 4, "b": 4}, PolicyKnobs(preemption=PreemptionMode.NONE,
                                                        starvation_after_s=None)), nodes(1))
    s2.submit(gang("a-run", "a", (8,)), 0)
    s2.schedule(0)
    s2.submit(gang("a-old", "a", (1,)), 10)
    s2.submit(gang("b-new", "b", (1,)), 5000)
    s2.release("a-run#1", 5000, finished=True)
    assert [x.workload_id for x in s2.schedule(5000).starts] == ["b-new", "a-old"]


def test_restart_cost_spares_a_big_gang_that_just_checkpointed() -> None:
    # Borrowers of team a: an 8-GPU gang that checkpointed 10 s ago (node n0) and a 1-GPU job
    # with 310 s of unsaved work (n1, next to b's own 7 GPUs). b reclaims one GPU.
    def victim(restart_s: float) -> str:
        s = Scheduler(policy({"a": 0, "b": 8}, PolicyKnobs(restart_cost_s=restart_s)), nodes(2))
        s.submit(gang("gang", "a", (8,), "training", checkpoint_s=1000), 0)
        s.submit(gang("rest", "b", (7,), "training"), 0)
        s.schedule(0)
        s.submit(gang("one", "a", (1,), "training"), 700)
        s.schedule(700)
        s.submit(gang("b0", "b", (1,), "exploratory"), 1010)
        return s.schedule(1010).notices[0].workload_id

    assert victim(0.0) == "gang"  # 8 x 10 s = 80 < 1 x 310 s
    assert victim(600.0) == "one"  # 8 x 610 s > 1 x 910 s


def test_a_reservation_stops_backfill_but_not_higher_priority_work() -> None:
    knobs = PolicyKnobs(preemption=PreemptionMode.NONE, enforce_quota=False, max_reservations=1)
    s = Scheduler(policy({"a": 8}, knobs), nodes(1))
    s.submit(gang("small", "a", (4,), "exploratory"), 0)
    s.schedule(0)
    s.submit(gang("big", "a", (8,), "training"), 1)
    assert [r.workload_id for r in s.schedule(1).reservations] == ["big"]
    s.submit(gang("filler", "a", (2,), "exploratory"), 2)
    assert not s.schedule(2).starts  # lower priority than the reservation: backfill, refused
    s.submit(gang("inf", "a", (2,), "production-inference"), 3)
    assert [x.workload_id for x in s.schedule(3).starts] == ["inf"]
