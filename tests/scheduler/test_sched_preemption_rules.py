"""Who may be a victim, and when a blocked borrower may look for one (issue 18, findings 1 and 6)."""

from __future__ import annotations

from sched_support import gang, nodes, policy

from switchyard.scheduler.core import PolicyKnobs, PreemptionReason, Scheduler


def test_a_borrower_refused_for_lack_of_lendable_capacity_preempts_lower_priority() -> None:
    """Finding 1: with unlimited lending the quota check refuses a borrowing gang exactly when
    fewer GPUs are free than it needs. That is a capacity block, not an over-quota one: the
    gang may preempt lower-priority borrowers of other teams, and it starts once they leave."""
    s = Scheduler(policy({"a": 12, "b": 4, "c": 0}), nodes(2))
    s.submit(gang("c-exp", "c", (8,), "exploratory"), 0)  # c borrows a whole node
    s.submit(gang("a-0", "a", (4,), "training"), 0)
    s.submit(gang("a-1", "a", (4,), "training"), 0)
    assert len(s.schedule(0).starts) == 3 and s.pool.free_gpus == 0
    s.submit(gang("b-big", "b", (8,), "training"), 10)  # 8 > b's guarantee of 4: it borrows
    d = s.schedule(10)
    assert [(n.workload_id, n.reason, n.preemptor) for n in d.notices] == [
        ("c-exp", PreemptionReason.PRIORITY, "b-big")
    ]
    d = s.schedule(10 + PolicyKnobs().preemption_grace_s)
    assert [x.workload_id for x in d.stops] == ["c-exp"]
    s.release(d.stops[0].lease_id, 200)
    starts = s.schedule(200).starts
    assert [(x.workload_id, x.borrowing) for x in starts] == [("b-big", True)]


def test_a_borrower_refused_for_lack_of_lendable_capacity_gets_a_reservation() -> None:
    """Finding 1, the other half: with no victim to take, the blocked borrowing gang holds the
    reservation, so backfill of its priority cannot keep taking the GPUs it waits for."""
    s = Scheduler(policy({"a": 12, "b": 4}), nodes(2))
    s.submit(gang("a-0", "a", (8,), "training"), 0)
    s.submit(gang("a-1", "a", (4,), "training"), 0)
    assert len(s.schedule(0).starts) == 2  # 4 GPUs free on one node
    s.submit(gang("b-big", "b", (8,), "training"), 10)
    d = s.schedule(10)
    assert not d.starts and not d.notices
    assert [r.workload_id for r in d.reservations] == ["b-big"]
    s.submit(gang("b-small", "b", (4,), "training"), 11)  # within b's guarantee, same priority
    d = s.schedule(11)
    assert not d.starts  # the only free GPUs are b-big's


def test_a_non_preemptible_lease_in_a_mixed_borrowing_entry_is_never_reclaimed() -> None:
    """Finding 6: team a's one quota entry holds both inference (non-preemptible) and training.
    a borrows through its training; when b reclaims its guarantee, only the training lease may
    go, though the inference lease would be the cheaper victim."""
    s = Scheduler(policy({"a": 2, "b": 6}), nodes(1))
    s.submit(gang("a-inf", "a", (2,), "production-inference"), 0)
    s.submit(gang("a-train", "a", (4,), "training"), 0)
    assert len(s.schedule(0).starts) == 2  # a uses 6 of its 2: it borrows 4
    s.submit(gang("b-0", "b", (6,), "exploratory"), 100)  # within b's guarantee: a reclaim
    notices = s.schedule(100).notices
    assert [(n.workload_id, n.reason) for n in notices] == [("a-train", PreemptionReason.RECLAIM)]
