"""The persistent victim index against a brute-force ranking of every running lease.

`core.preemption` no longer ranks all running leases for each victim search: it keeps a
`VictimIndex` across decisions; a one-node search visits nodes cheapest-first, or by its
first candidate's cost, and stops once the bounds pass the best total found; a search for a
gang on several nodes first checks, from the GPUs each node could free, which node groups could
hold it at all, and costs only their nodes that could hold a bundle. The references below are
the searches as they were before (every running lease judged by `core.protection`'s rules,
ranked, every node costed): a randomized differential test runs both on every victim search
of seeded random workloads and asserts the same plan and the same ranked candidates. The
seed of a failure is in the assertion message.
"""

from __future__ import annotations

import pickle
import random
from collections.abc import Mapping

import pytest
from sched_support import nodes

from switchyard.scheduler.core import (
    GangRequest,
    PlacementStrategy,
    PolicyKnobs,
    PreemptionMode,
    PriorityClass,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
    preemption,
)
from switchyard.scheduler.core.model import Lease, PreemptionReason
from switchyard.scheduler.core.preemption import VictimPlan, VictimSelector
from switchyard.scheduler.core.protection import protected_until
from switchyard.scheduler.core.quota import QuotaKey
from switchyard.scheduler.core.victim_index import VictimIndex

CLASSES = (
    PriorityClass("production-inference", 1000, preemptible=False),
    PriorityClass(
        "training", 100, True, min_runtime_s=600.0, preemption_backoff_s=300.0, max_preemption_backoff_s=2400.0
    ),
    PriorityClass("batch", 50, True, min_runtime_s=120.0, reclaim_min_runtime_s=60.0, preemption_backoff_s=300.0),
    PriorityClass("exploratory", 10, True),
)
KLASS = {
    "training": WorkloadClass.TRAINING,
    "batch": WorkloadClass.BATCH_FINE_TUNE,
    "exploratory": WorkloadClass.EXPLORATORY,
}
SHAPES = [(1,), (1,), (1,), (2,), (4,), (8,), (2, 2), (4, 4), (8, 8)]
INTERVALS = [None, None, 300.0, 900.0, 0.0]
RESEARCH = frozenset(KLASS.values())
Ranked = tuple[Lease, QuotaKey, bool, PreemptionReason, float, float]  # lease, entry, cross, reason, cost, work


# -- the reference: the victim search before the index -----------------------------------------
def reference_ranking(
    selector: VictimSelector, request: GangRequest, running: Mapping[QuotaKey, Mapping[str, Lease]], now: float
) -> list[Ranked]:
    """Every running lease the request may take, in the documented victim order."""
    policy = selector._policy
    book = selector._book
    priority = {p.name: p for p in policy.priority_classes}
    mine = priority[request.priority_class].value
    quota_rules = policy.knobs.enforce_quota and policy.knobs.preemption is not PreemptionMode.PRIORITY
    my_key = book.key(request.team, request.workload_class) if quota_rules else None
    reclaiming = my_key is not None and book.reclaiming(my_key, request.gpus)

    def may(lease: Lease, reason: PreemptionReason) -> bool:
        theirs = priority[lease.request.priority_class]
        if not theirs.preemptible:
            return False
        inference_reclaim = reason is PreemptionReason.RECLAIM and request.workload_class is WorkloadClass.INFERENCE
        return inference_reclaim or now >= protected_until(lease, theirs, reason)

    out = []
    for key, leases in running.items():
        cross = my_key is not None and key != my_key
        if cross and book.reclaimable(key) == 0:
            continue
        for lease in leases.values():
            if not priority[lease.request.priority_class].preemptible:
                continue
            work = lease.lost_gpu_seconds(now)
            lost = work + lease.gpus * policy.knobs.restart_cost_s
            if cross and reclaiming and may(lease, PreemptionReason.RECLAIM):
                out.append((lease, key, True, PreemptionReason.RECLAIM, lost, work))
            elif priority[lease.request.priority_class].value < mine and may(lease, PreemptionReason.PRIORITY):
                out.append((lease, key, cross, PreemptionReason.PRIORITY, lost, work))

    def order(c: tuple[Lease, QuotaKey, bool, PreemptionReason, float, float]) -> tuple[float, int, float, str]:
        lease, _, cross, _, lost, _ = c
        value = priority[lease.request.priority_class].value
        if policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE:
            return (lost, value, -lease.started_at, lease.lease_id)
        return (0 if cross else 1, value, -lease.started_at, lease.lease_id)

    return sorted(out, key=order)


def positions_by_node(ranked: list[Ranked]) -> dict[str, list[int]]:
    """Each node's candidates, as positions in the ranking, in victim order."""
    by_node: dict[str, list[int]] = {}
    for position, (lease, *_rest) in enumerate(ranked):
        for node in lease.gpus_by_node():
            by_node.setdefault(node, []).append(position)
    return by_node


def reference_cost(selector: VictimSelector, ranked: list[Ranked], chosen: list[int]) -> tuple[float, float]:
    """Summed cost, then summed position (CHECKPOINT_AWARE); else the worst position, then count."""
    if not chosen:
        return (0.0, 0.0)
    if selector._policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE:
        return (sum(ranked[p][4] for p in chosen), sum(chosen))
    return (max(chosen), len(chosen))


def reference_single_node(
    selector: VictimSelector, request: GangRequest, ranked: list[Ranked], held: Mapping[str, int]
) -> tuple[tuple[str, ...], str] | None:
    """Each node costed by its candidates in victim order until the gang fits; the cheapest
    (summed cost, then summed position, then name) wins. Returns (victim lease ids, node)."""
    pool, book = selector._pool, selector._book
    by_node = positions_by_node(ranked)
    best = None
    for node, positions in by_node.items():
        spec = pool.node(node)
        if spec.gpus - held.get(node, 0) < request.gpus:
            continue
        if request.node_group is not None and spec.node_group != request.node_group:
            continue
        need = request.gpus - (pool.free(node) - held.get(node, 0))
        chosen: list[int] = []
        taken: dict[QuotaKey, int] = {}
        for p in positions:
            if need <= 0:
                break
            lease, key, cross = ranked[p][0], ranked[p][1], ranked[p][2]
            if cross and book.reclaimable(key) - taken.get(key, 0) <= 0:
                continue
            chosen.append(p)
            taken[key] = taken.get(key, 0) + lease.gpus
            need -= lease.gpus_by_node()[node]
        if need > 0 or not chosen:
            continue
        cost = reference_cost(selector, ranked, chosen)
        if best is None or (cost, node) < (best[0], best[1]):
            best = (cost, node, chosen)
    if best is None:
        return None
    return tuple(ranked[p][0].lease_id for p in sorted(best[2])), best[1]


def reference_multi_node(
    selector: VictimSelector, request: GangRequest, ranked: list[Ranked], held: Mapping[str, int]
) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """Bundle by bundle (largest first), the node of the scope cheapest to clear for it; each
    node of every scope costed: a scope is the request's node group, each node group whose free
    GPUs (less those held) plus its candidates' GPUs could hold the gang, or the whole pool;
    the cheapest scope wins, and the pool places the gang on what its victims free. Returns
    (victim lease ids in victim order, placement)."""
    pool, book = selector._pool, selector._book
    by_node = positions_by_node(ranked)
    if not by_node:
        return None
    if request.node_group is not None:
        scopes = [pool.group_nodes(request.node_group)]
    elif request.same_node_group:
        room = {g: pool.group_free(g) for g in pool.group_names()}
        for node, gpus in held.items():
            if node in pool:
                room[pool.node(node).node_group] -= gpus
        for node, positions in by_node.items():
            room[pool.node(node).node_group] += sum(ranked[p][0].gpus_by_node()[node] for p in positions)
        scopes = [pool.group_nodes(g) for g, r in room.items() if r >= request.gpus]
    else:
        scopes = [[n.name for n in pool.nodes()]]

    def cost(chosen: list[int]) -> tuple[float, float]:
        return reference_cost(selector, ranked, chosen)

    best = None
    for names in scopes:
        chosen: list[int] = []
        taken: dict[QuotaKey, int] = {}
        bonus: dict[str, int] = {}
        used: set[str] = set()
        for size in sorted(request.bundles, reverse=True):
            pick = None
            for node in names:
                if node in used or pool.node(node).gpus - held.get(node, 0) < size:
                    continue
                avail = pool.free(node) - held.get(node, 0) + bonus.get(node, 0)
                need, extra, local = size - avail, [], dict(taken)
                for p in by_node.get(node, []):
                    if need <= 0:
                        break
                    lease, key, cross = ranked[p][0], ranked[p][1], ranked[p][2]
                    if p in chosen or (cross and book.reclaimable(key) - local.get(key, 0) <= 0):
                        continue
                    extra.append(p)
                    local[key] = local.get(key, 0) + lease.gpus
                    need -= lease.gpus_by_node()[node]
                if need > 0:
                    continue
                option = (cost(extra), avail, node, extra)
                if pick is None or option[:3] < pick[:3]:
                    pick = option
            if pick is None:
                break
            used.add(pick[2])
            for p in pick[3]:
                lease, key = ranked[p][0], ranked[p][1]
                chosen.append(p)
                taken[key] = taken.get(key, 0) + lease.gpus
                for node, gpus in lease.gpus_by_node().items():
                    bonus[node] = bonus.get(node, 0) + gpus
        else:
            if best is None or cost(chosen) < best[0]:
                best = (cost(chosen), chosen, bonus)
    if best is None:
        return None
    placement = pool.find(
        request.bundles,
        request.strategy,
        same_node_group=request.same_node_group,
        node_group=request.node_group,
        held=held,
        bonus=best[2],
    )
    if placement is None:
        return None
    return tuple(ranked[p][0].lease_id for p in sorted(best[1])), placement


class CheckedSelector(VictimSelector):
    """The index-backed selector, checked against the reference on every search."""

    seed = -1
    searches = 0
    gang_searches = 0  # multi-node searches, and those that found a plan
    gang_plans = 0

    def plan(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        held: Mapping[str, int],
        now: float,
    ) -> VictimPlan | None:
        got = super().plan(request, running, held, now)
        ranked = reference_ranking(self, request, running, now)
        asker = self._asker(request, running)
        mine = [(c.lease.lease_id, c.reason, c.lost, c.work_lost) for c in self._rank(self._candidates(asker, now))]
        want = [(lease.lease_id, reason, lost, work) for lease, _, _, reason, lost, work in ranked]
        assert mine == want, f"seed {self.seed}: candidates differ for {request.workload_id} at {now}"
        if len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK:
            expected = reference_single_node(self, request, ranked, held)
            actual = None if got is None else (tuple(v.lease.lease_id for v in got.victims), got.placement[0])
            assert actual == expected, f"seed {self.seed}: plan differs for {request.workload_id} at {now}"
            if got is not None:
                lost = {lease.lease_id: (reason, work) for lease, _, _, reason, _, work in ranked}
                assert [(v.reason, v.lost_gpu_seconds) for v in got.victims] == [lost[i] for i in actual[0]]
        else:
            expected_gang = reference_multi_node(self, request, ranked, held)
            actual_gang = None if got is None else (tuple(v.lease.lease_id for v in got.victims), got.placement)
            assert actual_gang == expected_gang, f"seed {self.seed}: gang plan differs for {request.workload_id}"
            CheckedSelector.gang_searches += 1
            CheckedSelector.gang_plans += got is not None
        CheckedSelector.searches += 1
        return got


def random_policy(rng: random.Random, mode: PreemptionMode) -> SchedulerPolicy:
    teams = [Team(f"t{i}", (Quota(RESEARCH, rng.choice([0, 4, 8, 16])),), 1.0) for i in range(rng.randint(2, 4))]
    teams.append(Team("inference", (Quota(frozenset({WorkloadClass.INFERENCE}), 8, 0),), 1.0))
    knobs = PolicyKnobs(
        preemption=mode,
        max_preemption_attempts=rng.choice([1, 3, 8]),
        preemption_retry_s=rng.choice([0.0, 60.0]),
        restart_cost_s=rng.choice([0.0, 600.0, 37.5]),
    )
    return SchedulerPolicy(CLASSES, tuple(teams), knobs)


def random_request(rng: random.Random, n: int, teams: list[str]) -> GangRequest:
    if rng.random() < 0.1:
        return GangRequest(f"w{n}", "inference", WorkloadClass.INFERENCE, "production-inference", (1,))
    name = rng.choice(list(KLASS))
    bundles = rng.choice(SHAPES)
    strategy = rng.choice([PlacementStrategy.PACK, PlacementStrategy.PACK, PlacementStrategy.STRICT_PACK])
    return GangRequest(
        f"w{n}", rng.choice(teams), KLASS[name], name, bundles, strategy, len(bundles) > 1, None, rng.choice(INTERVALS)
    )


def run_workload(seed: int, mode: PreemptionMode, events: int = 160) -> int:
    rng = random.Random(seed)
    policy = random_policy(rng, mode)
    teams = [t.name for t in policy.teams if t.name != "inference"]
    s = Scheduler(policy, nodes(rng.randint(4, 12), per_group=4))
    CheckedSelector.seed = seed
    s._victims = CheckedSelector(policy, s._book, s._pool)  # before any lease runs
    now, n = 0.0, 0
    for _ in range(events):
        roll = rng.random()
        leases = sorted(s.leases())
        if roll < 0.45:
            n += 1
            s.submit(random_request(rng, n, teams), now)
        elif roll < 0.65 and leases:
            s.release(rng.choice(leases), now, finished=True)
        elif roll < 0.8 and leases:
            s.report_checkpoint(s.leases()[rng.choice(leases)].request.workload_id, now)
        else:
            # Whole steps land exactly on checkpoint periods; fractional ones between them.
            now += rng.choice([60.0, 300.0, 900.0, rng.uniform(0.1, 700.0)])
        decisions = s.schedule(now)
        for stop in decisions.stops:
            s.release(stop.lease_id, now)
    return CheckedSelector.searches


@pytest.mark.parametrize("mode", [PreemptionMode.CHECKPOINT_AWARE, PreemptionMode.KUEUE, PreemptionMode.PRIORITY])
def test_index_searches_match_the_brute_force_ranking(mode: PreemptionMode) -> None:
    CheckedSelector.searches = CheckedSelector.gang_searches = CheckedSelector.gang_plans = 0
    for seed in range(40):
        run_workload(seed, mode)
    assert CheckedSelector.searches > 400  # the workloads do search for victims
    assert CheckedSelector.gang_plans > 20, CheckedSelector.gang_searches  # gangs on several nodes too


def test_cheapest_first_matches_even_when_every_search_uses_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """The cheapest-first walk serves only searches that may take many leases; forced on for
    every one-node search here, it must still give the brute force's plan."""
    monkeypatch.setattr(preemption, "_STREAM_SHARE", 1 << 30)
    CheckedSelector.searches = 0
    for seed in range(100, 140):
        run_workload(seed, PreemptionMode.CHECKPOINT_AWARE)
    assert CheckedSelector.searches > 400


def test_cheapest_bounds_stay_at_or_below_each_lease_cost() -> None:
    """Every entry comes out of `cheapest` at or below (w + restart) x max(gpus, need), where
    w is the time since its last checkpoint, and the bounds never decrease; times include
    exact period boundaries and a unix-epoch clock."""
    for seed in range(60):
        rng = random.Random(seed)
        index = VictimIndex(rng.choice([0.0, 600.0]))
        base = rng.choice([0.0, 1.7e9])
        now = base + rng.choice([5000.0, 5400.0, 9000.0, rng.uniform(5000, 20000)])
        priority = CLASSES[3]
        leases = []
        for i in range(rng.randint(1, 60)):
            interval = rng.choice(INTERVALS)
            start = base + rng.choice([0.0, 300.0, rng.uniform(0, 5000)])
            if interval and rng.random() < 0.4:  # whole periods before `now`, give or take a float
                start = now - rng.randint(1, 4) * interval + rng.choice([0.0, 1e-7, -1e-7, 1e-12])
            request = GangRequest(
                f"w{i}",
                "t",
                WorkloadClass.EXPLORATORY,
                "exploratory",
                (rng.choice([1, 2, 8]),),
                checkpoint_interval_s=interval,
            )
            lease = Lease(f"l{i}", request, ("n0",), start, base, False)
            index.add(lease, ("t", 0), priority)
            leases.append(lease)
        for lease in rng.sample(leases, len(leases) // 3):
            later = lease.started_at + rng.choice([0.0, 150.0, rng.uniform(0, 4000)])
            lease.last_checkpoint_at = min(later, now)
            index.checkpointed(lease.lease_id)
        for lease in rng.sample(leases, len(leases) // 4):
            index.remove(lease.lease_id)
            leases.remove(lease)
        need = rng.choice([1, 4, 8])
        first: dict[str, float] = {}
        previous = -1e300
        for bound, entry in index.cheapest(now, need):
            assert bound >= previous - 1e-6, f"seed {seed}"
            previous = bound
            first.setdefault(entry.lease.lease_id, bound)
        assert set(first) == {lease.lease_id for lease in leases}, f"seed {seed}"
        for lease in leases:
            since = now - lease.checkpointed_at(now)
            truth = (since + index._restart_cost_s) * max(lease.gpus, need)
            assert first[lease.lease_id] <= truth + 1e-9 * abs(truth), f"seed {seed}: {lease.lease_id}"


def test_a_pickled_core_rebuilds_its_index_and_decides_the_same() -> None:
    """The live scheduler journals the core by pickling it; the index is rebuilt on load."""
    rng = random.Random(7)
    policy = random_policy(rng, PreemptionMode.CHECKPOINT_AWARE)
    teams = [t.name for t in policy.teams if t.name != "inference"]
    s = Scheduler(policy, nodes(8, per_group=4))
    for n in range(40):
        s.submit(random_request(rng, n, teams), 0.0)
    s.schedule(0.0)
    copy = pickle.loads(pickle.dumps(s))
    for n in range(40, 80):
        now = 1000.0 + 50 * n
        request = random_request(rng, n, teams)
        s.submit(request, now)
        copy.submit(request, now)
        assert s.schedule(now) == copy.schedule(now)


def test_a_lease_on_its_period_boundary_comes_first() -> None:
    """At `now = start + k x I` in floats, `Lease.checkpointed_at` may say "just checkpointed"
    while `now mod I - start mod I` says "a whole period ago": the index must not put it last."""
    rng = random.Random(3)
    request = GangRequest("w", "t", WorkloadClass.EXPLORATORY, "exploratory", (1,), checkpoint_interval_s=3600.0)
    for trial in range(300):
        start = rng.uniform(0, 1e6)
        now = start + rng.randint(1, 1000) * 3600.0
        index = VictimIndex(600.0)
        lease = Lease("l", request, ("n0",), start, 0.0, False)
        index.add(lease, ("t", 0), CLASSES[3])
        [(bound, _)] = list(index.cheapest(now, 1))
        truth = now - lease.checkpointed_at(now) + 600.0
        assert bound <= truth, f"trial {trial}: start {start!r}, now {now!r}"
