"""Fair-share reclaim among borrowers (issue 18): who it takes, that inference reclaim keeps
its place, and that two borrowing teams do not ping-pong a lease."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import replace

from sched_support import ALL_CLASSES, gang, nodes

from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    PolicyKnobs,
    PreemptionReason,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)

GRACE = PolicyKnobs().preemption_grace_s


def fair_policy(guarantees: dict[str, int], on: bool = True, margin: float = 0.0) -> SchedulerPolicy:
    teams = [Team(t, (Quota(ALL_CLASSES - {WorkloadClass.INFERENCE}, g),)) for t, g in guarantees.items()]
    teams.append(Team("inf", (Quota(frozenset({WorkloadClass.INFERENCE}), 8, borrowing_limit_gpus=0),)))
    knobs = PolicyKnobs(fair_share_reclaim=on, fair_share_margin_gpus=margin)
    return SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, tuple(teams), knobs)


def fill_with_b(s: Scheduler, count: int) -> None:
    for i in range(count):
        s.submit(gang(f"b-{i}", "b", (8,), "exploratory"), 0)
    assert len(s.schedule(0).starts) == count


def test_a_borrower_below_its_share_takes_from_one_above_it() -> None:
    """a (guarantee 8) asks 16, borrowing 8 (share 1.0); b (guarantee 8) borrows 24 (share 3.0,
    2.0 after losing a gang): the rule takes one of b's gangs for a, which it would not
    without the knob (same priority, a not reclaiming)."""
    for on in (True, False):
        s = Scheduler(fair_policy({"a": 8, "b": 8, "c": 24}, on), nodes(5))
        fill_with_b(s, 4)  # 32 of 40 GPUs; c and inf idle, lending
        s.submit(gang("a-0", "a", (8,), "exploratory"), 1)
        s.submit(gang("a-1", "a", (8,), "exploratory"), 1)
        d = s.schedule(1)
        assert len(d.starts) == 1  # the last free node
        if on:
            assert [(n.reason, n.preemptor) for n in d.notices] == [(PreemptionReason.RECLAIM, "a-1")]
        else:
            assert not d.notices


def test_the_margin_holds_back_a_reclaim_that_would_nearly_even_the_shares() -> None:
    """With a margin of 16 GPUs a's 1.0 + 2.0 is above b's 2.0 after the loss: no victim."""
    s = Scheduler(fair_policy({"a": 8, "b": 8, "c": 24}, margin=16.0), nodes(5))
    fill_with_b(s, 4)
    s.submit(gang("a-0", "a", (8,), "exploratory"), 1)
    s.submit(gang("a-1", "a", (8,), "exploratory"), 1)
    d = s.schedule(1)
    assert len(d.starts) == 1 and not d.notices
    assert not s.schedule(2 + PolicyKnobs().preemption_retry_s).notices


def test_a_lease_within_its_teams_guarantee_is_never_taken_by_fair_share() -> None:
    """b runs exactly its guarantee: however far above b a's share goes, b is off limits."""
    s = Scheduler(fair_policy({"a": 0, "b": 32}), nodes(5))
    fill_with_b(s, 4)  # b at its guarantee, not borrowing
    s.submit(gang("a-0", "a", (8,), "exploratory"), 1)
    s.submit(gang("a-1", "a", (8,), "exploratory"), 1)
    d = s.schedule(1)
    assert len(d.starts) == 1 and not d.notices
    for t in (100.0, 10_000.0):
        assert not s.schedule(t).notices


def test_inference_reclaim_stays_first() -> None:
    """An inference reclaim and a fair-share borrower both blocked: inference is served in the
    same decision, by the reclaim rule, and starts after one grace period."""
    s = Scheduler(fair_policy({"a": 8, "b": 8, "c": 16}), nodes(5))
    fill_with_b(s, 5)  # all 40 GPUs: b borrows inf's idle guarantee too
    s.submit(gang("a-0", "a", (16,), "exploratory"), 1)
    s.submit(gang("serve", "inf", (8,), "production-inference"), 1)
    d = s.schedule(1)
    assert (d.notices[0].reason, d.notices[0].preemptor) == (PreemptionReason.RECLAIM, "serve")
    d = s.schedule(1 + GRACE)
    for stop in d.stops:
        s.release(stop.lease_id, 1 + GRACE)
    assert "serve" in [x.workload_id for x in s.schedule(1 + GRACE).starts]


def _run_two_borrowers(seed: int, margin: float) -> Counter[str]:
    """Teams a and b (guarantees 4) borrow c's idle 32 GPUs with random gangs; returns the
    preemptions each workload suffered."""
    rng = random.Random(seed)
    s = Scheduler(fair_policy({"a": 4, "b": 4, "c": 32}, margin=margin), nodes(5))
    arrivals = sorted(
        (rng.uniform(0, 20_000), f"{team}-{i}", team, rng.choice((4, 8)), rng.uniform(600, 8_000))
        for team in ("a", "b")
        for i in range(20)
    )
    duration = {wid: d for _, wid, _, _, d in arrivals}
    ends: dict[str, float] = {}
    preempted: Counter[str] = Counter()
    t, step = 0.0, 60.0
    while t < 200_000 and (arrivals or s.leases() or s.pending_count()):
        while arrivals and arrivals[0][0] <= t:
            _, wid, team, gpus, _ = arrivals.pop(0)
            s.submit(gang(wid, team, (gpus,), "exploratory"), t)
        for lease_id, lease in list(s.leases().items()):
            if ends.get(lease_id, float("inf")) <= t and lease.state.value == "running":
                s.release(lease_id, t, finished=True)
        d = s.schedule(t)
        for notice in d.notices:
            preempted[notice.workload_id] += 1
        for stop in d.stops:
            s.release(stop.lease_id, t)
        for start in d.starts:
            ends[start.lease_id] = t + duration[start.workload_id]
        t += step
    return preempted


def test_two_borrowing_teams_converge_without_ping_pong() -> None:
    """Seeded property: over generated workloads no workload is preempted more than three times by
    fair-share reclaim between two borrowing teams (no backoff: the margin alone holds)."""
    for seed in range(12):
        preempted = _run_two_borrowers(seed, margin=4.0)
        worst = max(preempted.values(), default=0)
        assert worst <= 3, f"seed {seed}: {preempted.most_common(3)}"


def test_multi_node_only_fair_reclaim_is_for_gangs_of_several_bundles() -> None:
    """`fair_share_reclaim_multi_node_only`: in the first test's cluster a one-node 8-GPU gang of
    a finds no fair-share victim; a 2x4 gang of the same team and share takes one of b's."""
    for bundles, reclaims in (((8,), False), ((4, 4), True)):
        policy = fair_policy({"a": 8, "b": 8, "c": 24})
        knobs = replace(policy.knobs, fair_share_reclaim_multi_node_only=True)
        s = Scheduler(replace(policy, knobs=knobs), nodes(5))
        fill_with_b(s, 4)
        s.submit(gang("a-0", "a", (8,), "exploratory"), 1)
        s.submit(gang("a-1", "a", bundles, "exploratory"), 1)
        d = s.schedule(1)
        assert len(d.starts) == 1
        taken = {(n.reason, n.preemptor) for n in d.notices}
        assert taken == ({(PreemptionReason.RECLAIM, "a-1")} if reclaims else set())
