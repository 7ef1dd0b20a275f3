"""Choosing preemption victims for a blocked gang.

Who may be a victim (KUEUE and CHECKPOINT_AWARE modes):
  0. never a lease of a non-preemptible priority class, whatever its quota entry borrows
     through other classes, nor an immune settled one (`settled.py`: its workload was
     preempted its class's `max_preemptions` times), whoever asks; any other settled lease
     only by inference reclaim, as its last resort;
  1. only a running lease (not one already preempting);
  2. of the preemptor's own quota entry: only a preemptible, lower-priority lease past its
     protection for priority preemption (`protection.py`: minimum runtime, backoff);
  3. of another entry: only while that entry is borrowing (above its guarantee, counting GPUs
     already being taken back); a gang cannot be split, so its whole lease goes even when that
     takes the entry below its guarantee (Kueue's rule; otherwise a gang larger than what it
     borrowed could never be reclaimed), and either the preemptor is reclaiming its own
     guarantee (any priority) and the victim is past its protection from reclaim (none
     against inference reclaim), or the victim is lower priority and past its protection
     from priority preemption;
  4. fair-share reclaim (knob `fair_share_reclaim`, `fair_reclaim.py`): a borrowing gang may also
     take a borrowing entry's lease of no higher priority, past both its protections, if its own
     share after admission plus the margin stays at or below the victim entry's share after
     the loss (Kueue's LessThanOrEqualToFinalShare); inference reclaim is rule 3, unchanged.
PRIORITY mode (the strict-priority baseline) keeps only the priority rule.

In which order (documented in docs/scheduler.md):
  CHECKPOINT_AWARE: fewest GPU-seconds lost since the victim's last checkpoint, then lower
  priority, then most recently started, then lease id.
  KUEUE / PRIORITY: borrowing victims of other teams first, then lower priority, then most
  recently started, then lease id (Kueue's order).
Placement-aware: each node is costed separately (its victims taken in that order until the
bundle fits) and the cheapest node wins; a multi-bundle gang takes, bundle by bundle, the
cheapest node in each allowed node group, and the cheapest group wins. Cost is the summed
lost GPU-seconds (CHECKPOINT_AWARE) or the position of the worst victim in the order.
Candidates come from a `VictimIndex` kept across decisions; a one-node CHECKPOINT_AWARE
search of an asker that may take many leases visits nodes cheapest-first and stops early,
with the same result as costing every node; any other one-node search visits nodes by their
first candidate's cost and stops the same way. A multi-bundle search first counts the GPUs
each node could free, and ranks candidates only if some node group could then hold the gang
(most such searches end there), costing only the nodes that could hold a bundle.
"""

from __future__ import annotations

import enum
import heapq
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from switchyard.scheduler.core.fair_reclaim import FairShares
from switchyard.scheduler.core.model import (
    GangRequest,
    Lease,
    PlacementStrategy,
    PreemptionReason,
    WorkloadClass,
)
from switchyard.scheduler.core.placement import NodePool
from switchyard.scheduler.core.policy import PreemptionMode, SchedulerPolicy
from switchyard.scheduler.core.protection import is_settled
from switchyard.scheduler.core.quota import QuotaBook, QuotaKey
from switchyard.scheduler.core.settled import SettledLeases
from switchyard.scheduler.core.victim_index import VictimEntry, VictimIndex


@dataclass(frozen=True, slots=True)
class Victim:
    lease: Lease
    reason: PreemptionReason
    lost_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class VictimPlan:
    victims: tuple[Victim, ...]
    placement: tuple[str, ...]


_STREAM_SHARE = 8  # cheapest-first when the asker may take at least 1/8 of the leases
_FLOAT_MARGIN = 1.0 + 1e-9  # the bound is in real numbers; the totals are float sums


class _Rule(enum.Enum):
    """Which of the rules above lets an asker take a lease."""

    RECLAIM = "reclaim"  # rule 3, its guarantee
    PRIORITY = "priority"  # rules 2 and 3, lower priority
    FAIR_SHARE = "fair share"  # rule 4


@dataclass(slots=True)
class _Candidate:
    lease: Lease
    key: QuotaKey
    cross_team: bool
    reason: PreemptionReason
    lost: float  # ranking cost: work since the last checkpoint plus the restart, GPU-seconds
    work_lost: float  # work since the last checkpoint alone, GPU-seconds
    order: tuple[float, int, float, str]  # checkpoint-aware order: lost, priority, -start, id
    position: int = 0
    fair_bar: float | None = None
    """Taken by fair-share reclaim: the share its entry must keep after the loss."""


@dataclass(frozen=True, slots=True)
class _Asker:
    """Who is looking for victims, as the rules above see it; fixed for one search."""

    mine: int
    entries: Mapping[QuotaKey, bool]
    """The quota entries it may take from, each with whether it is another team's (cross)."""
    reclaiming: bool
    inference: bool
    fair_bar: float | None = None
    """Fair-share reclaim applies: the share a victim's entry must keep (`FairShares.bar`)."""
    fair_entries: frozenset[QuotaKey] = frozenset()
    """The entries whose share is above that bar now: the only ones it may take from so."""


class VictimSelector:
    """Victim searches over a `VictimIndex` the scheduler keeps up to date (`track`,
    `untrack`, `checkpointed`). Every search sees the leases as they are at that moment."""

    def __init__(self, policy: SchedulerPolicy, book: QuotaBook, pool: NodePool) -> None:
        self._policy = policy
        self._book = book
        self._pool = pool
        self._priority = {p.name: p for p in policy.priority_classes}
        self._index = VictimIndex(policy.knobs.restart_cost_s)
        weights = {t.name: t.weight for t in policy.teams}
        self._fair = FairShares(book, weights, policy.knobs.fair_share_margin_gpus)
        self.settled = SettledLeases(book)
        # Work each lease would lose at `_work_at`: a decision's searches all ask at one time.
        self._work_at = math.nan
        self._work: dict[str, float] = {}

    # -- upkeep ---------------------------------------------------------------------------
    def track(self, lease: Lease, key: QuotaKey) -> None:
        """`lease` runs: a possible victim if its class is preemptible."""
        priority = self._priority[lease.request.priority_class]
        if not priority.preemptible:
            return  # never a victim (finding 6)
        if not is_settled(priority, lease.prior_preemptions):
            self._index.add(lease, key, priority)
        elif self.settled.fits(key, lease.gpus):
            self.settled.add(lease, key)  # immune: runs to the end
        else:
            self.settled.expose(lease, key)
            self._index.add(lease, key, priority, last_resort=True)

    def untrack(self, lease: Lease) -> None:
        entry = self._index.get(lease.lease_id)
        if entry is not None:
            self._index.remove(lease.lease_id)
            if entry.last_resort:
                self.settled.unexpose(lease, entry.key)
        elif lease.lease_id in self.settled:
            for promoted in self.settled.remove(lease.lease_id):
                self._index.remove(promoted.lease_id)  # immune now: no one's victim

    def checkpointed(self, lease: Lease) -> None:
        self._index.checkpointed(lease.lease_id)
        self._work.pop(lease.lease_id, None)

    # -- searches -------------------------------------------------------------------------
    def plan(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        held: Mapping[str, int],
        now: float,
    ) -> VictimPlan | None:
        """Victims and the placement they make room for; `running` holds the running (not
        preempting) leases by quota entry: only its entries are searched. `request` is as tried
        on one GPU type: its `gpu_types` names that type alone (none: the implicit type), whose
        quota entry it asks of; the caller confines `held` to that type's nodes."""
        asker = self._asker(request, running)
        single = len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK
        takeable = self._takeable(asker)
        if takeable == 0:
            return None
        # Walking the index cheapest-first pays when the asker may take most leases (inference
        # reclaim, a high priority): it stops after a few. Otherwise its candidates are few,
        # and ranking them all is cheaper than passing every lease it may not take.
        if (
            single
            and self._policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE
            and takeable * _STREAM_SHARE >= len(self._index)
        ):
            return self._plan_cheapest_node(request, asker, held, now)
        if single:
            by_node = self._by_node(self._rank(self._candidates(asker, now)))
            return self._plan_single_node(request, by_node, held) if by_node else None
        # Most multi-node searches find no node set that could hold the gang: that needs only
        # how many GPUs each node could free, not the candidates' costs and ranks.
        freed = self._takeable_by_node(asker, now)
        scopes = self._scopes(request, freed, held) if freed else []
        if not scopes:
            return None
        return self._plan_multi_node(request, scopes, self._by_node(self._rank(self._candidates(asker, now))), held)

    def plan_escalation(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        held: Mapping[str, int],
        now: float,
    ) -> VictimPlan | None:
        """Victims for a gang past its second wait bound (`starvation.py`): running leases of a
        strictly lower priority class past their protection from priority preemption, of any
        team, borrowing or not. At most one search per starving gang per retry."""
        mine = self._priority[request.priority_class].value
        out: list[_Candidate] = []
        for entry in self._index.entries():
            if entry.key in running and entry.value < mine and now >= entry.priority_from and not entry.last_resort:
                # Not `cross_team`: escalation takes it whatever its team's guarantee.
                out.append(self._candidate(entry, False, PreemptionReason.PRIORITY, now))
        by_node = self._by_node(self._rank(out))
        if not by_node:
            return None
        if len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK:
            return self._plan_single_node(request, by_node, held)
        freed = {node: sum(c.lease.gpus_by_node()[node] for c in on_node) for node, on_node in by_node.items()}
        return self._plan_multi_node(request, self._scopes(request, freed, held), by_node, held)

    # -- who ------------------------------------------------------------------------------
    def _asker(self, request: GangRequest, running: Mapping[QuotaKey, object]) -> _Asker:
        gpu_type = request.gpu_types[0] if request.gpu_types else ""
        my_key = self._book.key(request.team, request.workload_class, gpu_type) if self._quota_rules else None
        entries: dict[QuotaKey, bool] = {}
        for key in running:
            cross = my_key is not None and key != my_key
            if cross and self._book.reclaimable(key) == 0:
                continue  # never below its guarantee: a team that is not borrowing is off limits
            entries[key] = cross
        reclaiming = my_key is not None and self._book.reclaiming(my_key, request.gpus)
        bar: float | None = None
        fair: frozenset[QuotaKey] = frozenset()
        if my_key is not None and not reclaiming and self._fair_reclaims(request):
            bar = self._fair.bar(my_key, request.gpus)
            fair = frozenset(k for k, cross in entries.items() if cross and self._fair.share(k) > bar)
        return _Asker(
            self._priority[request.priority_class].value,
            entries,
            reclaiming,
            request.workload_class is WorkloadClass.INFERENCE,
            bar,
            fair,
        )

    def _fair_reclaims(self, request: GangRequest) -> bool:
        """Whether fair-share reclaim applies to `request` at all (knobs)."""
        knobs = self._policy.knobs
        return knobs.fair_share_reclaim and (len(request.bundles) > 1 or not knobs.fair_share_reclaim_multi_node_only)

    def may_reclaim_fairly(self, request: GangRequest, running: Mapping[QuotaKey, object]) -> bool:
        """Cheap test before a search: may fair-share reclaim give `request` (as tried on one GPU
        type) any victim at all? Some other entry must be above its bar now."""
        if not (self._quota_rules and self._fair_reclaims(request)):
            return False
        return bool(self._asker(request, running).fair_entries)

    def _judge(self, entry: VictimEntry, asker: _Asker, now: float) -> _Candidate | None:
        """The candidate `entry` is for `asker` now, or None if it may not be taken."""
        rule = self._rule(entry, asker, now)
        if rule is None:
            return None
        if rule is _Rule.RECLAIM:  # `cross`: the team borrows, and its gang goes whole
            return self._candidate(entry, True, PreemptionReason.RECLAIM, now)
        if rule is _Rule.PRIORITY:
            return self._candidate(entry, asker.entries[entry.key], PreemptionReason.PRIORITY, now)
        candidate = self._candidate(entry, True, PreemptionReason.RECLAIM, now)
        candidate.fair_bar = asker.fair_bar
        return candidate

    def _rule(self, entry: VictimEntry, asker: _Asker, now: float) -> _Rule | None:
        """Which rule lets `asker` take `entry` now, if any. Protection (`core.protection`) as
        thresholds the index keeps; inference reclaim ignores it."""
        cross = asker.entries.get(entry.key)
        if cross is None or (entry.last_resort and not asker.inference):
            return None
        if cross and asker.reclaiming and (asker.inference or now >= entry.reclaim_from):
            return _Rule.RECLAIM
        if entry.value < asker.mine and now >= entry.priority_from:
            return _Rule.PRIORITY
        if (
            asker.fair_bar is not None
            and entry.key in asker.fair_entries
            and entry.value <= asker.mine
            and now >= max(entry.priority_from, entry.reclaim_from)  # not its owner: both protections
            and self._fair.allows(asker.fair_bar, entry.key, entry.gpus)
        ):
            return _Rule.FAIR_SHARE
        return None

    def _takeable_by_node(self, asker: _Asker, now: float) -> dict[str, int]:
        """GPUs per node of the leases `asker` may take now: what `_candidates` would find,
        without costing or ranking them."""
        freed: dict[str, int] = {}
        for (key, value), entries in self._index.cells():
            if not self._may_take_from(asker, key, value):
                continue
            for entry in entries:
                if self._rule(entry, asker, now) is not None:
                    for node, gpus in entry.lease.gpus_by_node().items():
                        freed[node] = freed.get(node, 0) + gpus
        return freed

    def _candidates(self, asker: _Asker, now: float) -> list[_Candidate]:
        out: list[_Candidate] = []
        for (key, value), entries in self._index.cells():
            if not self._may_take_from(asker, key, value):
                continue
            for entry in entries:
                candidate = self._judge(entry, asker, now)
                if candidate is not None:
                    out.append(candidate)
        return out

    @staticmethod
    def _may_take_from(asker: _Asker, key: QuotaKey, value: int) -> bool:
        """Whether any lease of the cell (quota entry, priority value) may be taken, protection
        aside: skip it whole if not."""
        cross = asker.entries.get(key)
        if cross is None:
            return False
        return value < asker.mine or (cross and asker.reclaiming) or (key in asker.fair_entries and value <= asker.mine)

    def _takeable(self, asker: _Asker) -> int:
        """Leases in the cells `asker` may take from (protection aside)."""
        cells = self._index.cells()
        return sum(len(entries) for (key, value), entries in cells if self._may_take_from(asker, key, value))

    def _rank(self, candidates: list[_Candidate]) -> list[_Candidate]:
        candidates.sort(key=self._order_key(self._policy.knobs.preemption))
        for i, c in enumerate(candidates):
            c.position = i
        return candidates

    @staticmethod
    def _by_node(ranked: list[_Candidate]) -> dict[str, list[_Candidate]]:
        by_node: dict[str, list[_Candidate]] = {}
        for c in ranked:
            for node in c.lease.gpus_by_node():
                by_node.setdefault(node, []).append(c)
        return by_node

    @property
    def _quota_rules(self) -> bool:
        knobs = self._policy.knobs
        return knobs.enforce_quota and knobs.preemption is not PreemptionMode.PRIORITY

    def _candidate(self, entry: VictimEntry, cross: bool, reason: PreemptionReason, now: float) -> _Candidate:
        if now != self._work_at:
            self._work_at = now
            self._work = {}
        lease = entry.lease
        work = self._work.get(lease.lease_id)
        if work is None:
            work = self._work[lease.lease_id] = lease.lost_gpu_seconds(now)
        lost = work + entry.restart
        return _Candidate(lease, entry.key, cross, reason, lost, work, (lost, *entry.tie))

    def _order_key(self, mode: PreemptionMode) -> Callable[[_Candidate], tuple[float, int, float, str]]:
        def checkpoint_aware(c: _Candidate) -> tuple[float, int, float, str]:
            return c.order

        def kueue(c: _Candidate) -> tuple[float, int, float, str]:
            _, value, newest, lease_id = c.order
            return (0 if c.cross_team else 1, value, newest, lease_id)

        return checkpoint_aware if mode is PreemptionMode.CHECKPOINT_AWARE else kueue

    def _cost(self, chosen: list[_Candidate]) -> tuple[float, float]:
        if not chosen:
            return (0.0, 0.0)
        if self._policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE:
            return (sum(c.lost for c in chosen), sum(c.position for c in chosen))
        return (max(c.position for c in chosen), len(chosen))

    def _keeps_guarantee(self, c: _Candidate, taken: dict[QuotaKey, int]) -> bool:
        """Another team's lease may go only while that team still borrows: a team at or below
        its guarantee is off limits, but a borrowing gang is taken whole."""
        if not c.cross_team:
            return True
        if c.fair_bar is not None:  # fair-share reclaim: the entry keeps the share it must
            return self._fair.allows(c.fair_bar, c.key, taken.get(c.key, 0) + c.lease.gpus)
        return self._book.reclaimable(c.key) - taken.get(c.key, 0) > 0

    # -- how many -------------------------------------------------------------------------
    def _plan_cheapest_node(
        self, request: GangRequest, asker: _Asker, held: Mapping[str, int], now: float
    ) -> VictimPlan | None:
        """Checkpoint-aware, one node: the choice `_plan_single_node` makes over every
        candidate, visiting nodes as the index's bounds rise. A node none of whose candidates
        came yet costs at least the bound, so once it passes the best total found, no node
        left can beat it or tie it (ties go to the lower summed positions, then the name)."""
        judged: dict[str, _Candidate | None] = {}
        visited: set[str] = set()
        best_lost = math.inf
        options: list[tuple[float, str, list[_Candidate]]] = []
        need = max(1, request.gpus - self._pool.most_available(held))  # the least any node needs freed
        for bound, entry in self._index.cheapest(now, need):
            if bound > best_lost * _FLOAT_MARGIN:
                break
            if self._judged(entry, asker, now, judged) is None:
                continue
            for node in entry.lease.gpus_by_node():
                if node in visited:
                    continue
                visited.add(node)
                option = self._clear_node(request, node, asker, held, now, judged)
                if option is not None and option[0] <= best_lost:
                    best_lost = option[0]
                    options.append(option)
        cheapest = [o for o in options if o[0] == best_lost]
        if not cheapest:
            return None
        if len(cheapest) == 1:
            _, node, chosen = cheapest[0]
        else:
            _, node, chosen = min(cheapest, key=self._tie_break(cheapest, asker, now))
        return VictimPlan(self._victims(chosen), (node,) * len(request.bundles))

    def _tie_break(
        self, options: list[tuple[float, str, list[_Candidate]]], asker: _Asker, now: float
    ) -> Callable[[tuple[float, str, list[_Candidate]]], tuple[object, str]]:
        """Equal totals go to the lower summed positions in the full ranking, then the node
        name. With one victim each, positions compare as the victims' order does; otherwise
        (rare: float-equal totals of several victims) every candidate is ranked."""
        if all(len(o[2]) == 1 for o in options):
            return lambda o: (o[2][0].order, o[1])
        rank = {c.lease.lease_id: c.position for c in self._rank(self._candidates(asker, now))}
        return lambda o: (sum(rank[c.lease.lease_id] for c in o[2]), o[1])

    def _judged(
        self, entry: VictimEntry, asker: _Asker, now: float, judged: dict[str, _Candidate | None]
    ) -> _Candidate | None:
        lease_id = entry.lease.lease_id
        if lease_id not in judged:
            judged[lease_id] = self._judge(entry, asker, now)
        return judged[lease_id]

    def _clear_node(
        self,
        request: GangRequest,
        node: str,
        asker: _Asker,
        held: Mapping[str, int],
        now: float,
        judged: dict[str, _Candidate | None],
    ) -> tuple[float, str, list[_Candidate]] | None:
        """One node of `_plan_single_node`: its candidates in victim order until the gang fits."""
        if not self._may_hold(request, node, held):
            return None
        on_node = [c for e in self._index.on_node(node) if (c := self._judged(e, asker, now, judged)) is not None]
        on_node.sort(key=_by_order)
        chosen = self._fill_node(request, node, on_node, held)
        return None if chosen is None else (sum(c.lost for c in chosen), node, chosen)

    def _may_hold(self, request: GangRequest, node: str, held: Mapping[str, int]) -> bool:
        """Whether the gang fits on `node` at all once its victims have left."""
        spec = self._pool.node(node)
        if spec.gpus - held.get(node, 0) < request.gpus:
            return False
        return request.node_group is None or spec.node_group == request.node_group

    def _fill_node(
        self, request: GangRequest, node: str, ordered: list[_Candidate], held: Mapping[str, int]
    ) -> list[_Candidate] | None:
        """Victims on `node`, taken in `ordered`'s order, until the gang fits (None: it never does)."""
        need = request.gpus - (self._pool.free(node) - held.get(node, 0))
        chosen: list[_Candidate] = []
        taken: dict[QuotaKey, int] = {}
        for c in ordered:
            if need <= 0:
                break
            if not self._keeps_guarantee(c, taken):
                continue
            chosen.append(c)
            taken[c.key] = taken.get(c.key, 0) + c.lease.gpus
            need -= c.lease.gpus_by_node()[node]
        return chosen if need <= 0 and chosen else None

    def _plan_single_node(
        self, request: GangRequest, by_node: dict[str, list[_Candidate]], held: Mapping[str, int]
    ) -> VictimPlan | None:
        best: tuple[tuple[float, float], str, list[_Candidate]] | None = None
        # A node costs at least its first candidate's cost (lost GPU-seconds, or position, are
        # never below it for the candidates after it): visit nodes by that bound and stop once
        # it passes the best cost found; a node at the bound may still tie, and win on name.
        first = _lost_of if self._policy.knobs.preemption is PreemptionMode.CHECKPOINT_AWARE else _position_of
        for bound, node, on_node in sorted((first(on[0]), node, on) for node, on in by_node.items()):
            if best is not None and bound > best[0][0] * _FLOAT_MARGIN:
                break
            if not self._may_hold(request, node, held):
                continue
            chosen = self._fill_node(request, node, on_node, held)
            if chosen is None:
                continue
            cost = self._cost(chosen)
            if best is None or (cost, node) < (best[0], best[1]):
                best = (cost, node, chosen)
        if best is None:
            return None
        return VictimPlan(self._victims(best[2]), (best[1],) * len(request.bundles))

    def _plan_multi_node(
        self,
        request: GangRequest,
        scopes: list[list[str]],
        by_node: dict[str, list[_Candidate]],
        held: Mapping[str, int],
    ) -> VictimPlan | None:
        best: tuple[tuple[float, float], list[_Candidate], dict[str, int]] | None = None
        for names in scopes:
            plan = self._plan_in_scope(request, names, by_node, held)
            if plan is not None and (best is None or plan[0] < best[0]):
                best = plan
        if best is None:
            return None
        placement = self._pool.find_gang(request, held, best[2])
        if placement is None:
            return None
        return VictimPlan(self._victims(best[1]), placement)

    def _scopes(self, request: GangRequest, freed: Mapping[str, int], held: Mapping[str, int]) -> list[list[str]]:
        """The node sets a multi-bundle gang may be placed in (its node group; each node group
        whose free GPUs, less those held, plus its candidates' GPUs could hold the gang; or the
        whole pool), in the pool's group order, each cut to the nodes that could hold one of
        its bundles once every candidate on them left (`room`, from `freed`: the candidates'
        GPUs per node). A set goes only if each bundle could then have a node of its own (the
        largest bundle on the roomiest node, and so on: Hall's condition for one node per
        bundle). The cuts are necessary for `_plan_in_scope` to succeed, and its choice of
        node does not depend on the order it visits them, so they change no plan: they spare
        costing hopeless nodes."""
        pool = self._pool
        smallest = min(request.bundles)
        room: dict[str, int] = {}  # only nodes that could hold the smallest bundle
        for node, gpus in freed.items():
            if node in pool and (r := pool.free(node) - held.get(node, 0) + gpus) >= smallest:
                room[node] = r
        for node in pool.nodes_with_free():  # any other node has no room
            if node not in freed and (r := pool.free(node) - held.get(node, 0)) >= smallest:
                room[node] = r
        largest_first = sorted(request.bundles, reverse=True)
        if request.node_group is None and not request.same_node_group:
            everywhere = list(room)
            return [everywhere] if _each_bundle_has_a_node(largest_first, list(room.values())) else []
        in_group: dict[str, list[str]] = {}
        for node in room:
            group = pool.node(node).node_group
            if request.node_group is None or group == request.node_group:
                in_group.setdefault(group, []).append(node)
        rooms = None if request.node_group is not None else pool.group_rooms(held, freed)
        return [
            names
            for group in pool.group_names()
            if (names := in_group.get(group)) is not None
            and _each_bundle_has_a_node(largest_first, [room[n] for n in names])
            and (rooms is None or rooms[group] >= request.gpus)
        ]

    def _plan_in_scope(
        self,
        request: GangRequest,
        names: list[str],
        by_node: dict[str, list[_Candidate]],
        held: Mapping[str, int],
    ) -> tuple[tuple[float, float], list[_Candidate], dict[str, int]] | None:
        """One node per bundle (largest first), each the node cheapest to clear for it."""
        chosen: list[_Candidate] = []
        taken: dict[QuotaKey, int] = {}
        bonus: dict[str, int] = {}
        used: set[str] = set()
        for size in sorted(request.bundles, reverse=True):
            pick: tuple[tuple[float, float], int, str, list[_Candidate]] | None = None
            for node in names:
                if node in used or self._pool.node(node).gpus - held.get(node, 0) < size:
                    continue
                avail = self._pool.free(node) - held.get(node, 0) + bonus.get(node, 0)
                extra = self._clear(node, size - avail, by_node.get(node, []), taken, chosen)
                if extra is None:
                    continue
                option = (self._cost(extra), avail, node, extra)
                if pick is None or option[:3] < pick[:3]:
                    pick = option
            if pick is None:
                return None
            used.add(pick[2])
            for c in pick[3]:
                chosen.append(c)
                taken[c.key] = taken.get(c.key, 0) + c.lease.gpus
                _add(bonus, c.lease.gpus_by_node(), 1)
        return (self._cost(chosen), chosen, bonus)

    def _clear(
        self,
        node: str,
        need: int,
        on_node: list[_Candidate],
        taken: dict[QuotaKey, int],
        already: list[_Candidate],
    ) -> list[_Candidate] | None:
        """Victims on `node`, in victim order, until `need` GPUs are free; None if impossible."""
        extra: list[_Candidate] = []
        local = dict(taken)
        for c in on_node:
            if need <= 0:
                break
            if c in already or not self._keeps_guarantee(c, local):
                continue
            extra.append(c)
            local[c.key] = local.get(c.key, 0) + c.lease.gpus
            need -= c.lease.gpus_by_node()[node]
        return extra if need <= 0 else None

    def _victims(self, chosen: list[_Candidate]) -> tuple[Victim, ...]:
        ordered = sorted(chosen, key=self._order_key(self._policy.knobs.preemption))  # = by position
        return tuple(Victim(c.lease, c.reason, c.work_lost) for c in ordered)


def _each_bundle_has_a_node(largest_first: list[int], rooms: list[int]) -> bool:
    if len(rooms) < len(largest_first):
        return False
    roomiest = heapq.nlargest(len(largest_first), rooms)
    return all(r >= size for r, size in zip(roomiest, largest_first, strict=True))


def _lost_of(c: _Candidate) -> float:
    return c.lost


def _position_of(c: _Candidate) -> float:
    return c.position


def _by_order(c: _Candidate) -> tuple[float, int, float, str]:
    return c.order


def _add(into: dict[str, int], gpus_by_node: Mapping[str, int], sign: int) -> None:
    for node, gpus in gpus_by_node.items():
        into[node] = into.get(node, 0) + sign * gpus
        if into[node] == 0:
            del into[node]
