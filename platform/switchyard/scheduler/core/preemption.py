"""Choosing preemption victims for a blocked gang.

Who may be a victim (KUEUE and CHECKPOINT_AWARE modes):
  0. never a lease of a non-preemptible priority class, whatever its quota entry borrows
     through other classes;
  1. only a running lease (not one already preempting);
  2. of the preemptor's own quota entry: only a preemptible, lower-priority lease past its
     protection for priority preemption (`protection.py`: minimum runtime, backoff);
  3. of another entry: only while that entry is borrowing (above its guarantee, counting GPUs
     already being taken back); a gang cannot be split, so its whole lease goes even when that
     takes the entry below its guarantee (Kueue's rule; otherwise a gang larger than what it
     borrowed could never be reclaimed), and either the preemptor is reclaiming its own
     guarantee (any priority) and the victim is past its protection from reclaim (none
     against inference reclaim), or the victim is lower priority and past its protection
     from priority preemption.
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
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from switchyard.scheduler.core.model import (
    GangRequest,
    Lease,
    PlacementStrategy,
    PreemptionReason,
    WorkloadClass,
)
from switchyard.scheduler.core.placement import NodePool
from switchyard.scheduler.core.policy import PreemptionMode, SchedulerPolicy
from switchyard.scheduler.core.protection import may_preempt
from switchyard.scheduler.core.quota import QuotaBook, QuotaKey


@dataclass(frozen=True, slots=True)
class Victim:
    lease: Lease
    reason: PreemptionReason
    lost_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class VictimPlan:
    victims: tuple[Victim, ...]
    placement: tuple[str, ...]


@dataclass(slots=True)
class _Candidate:
    lease: Lease
    key: QuotaKey
    cross_team: bool
    reason: PreemptionReason
    lost: float  # ranking cost: work since the last checkpoint plus the restart, GPU-seconds
    work_lost: float  # work since the last checkpoint alone, GPU-seconds
    position: int = 0


class VictimSelector:
    def __init__(self, policy: SchedulerPolicy, book: QuotaBook, pool: NodePool) -> None:
        self._policy = policy
        self._book = book
        self._pool = pool
        self._priority = {p.name: p for p in policy.priority_classes}
        # Candidates (and their per-node index) for one decision, keyed by who is asking;
        # valid until a notice changes who may be a victim.
        self._cache: dict[tuple[object, ...], tuple[list[_Candidate], dict[str, list[_Candidate]]]] = {}
        self._cache_at: float | None = None

    def forget(self, lease_ids: set[str]) -> None:
        """Noticed victims are no longer candidates. The rest of the cache stays valid: the
        guarantee check at selection time re-reads how much each team may still lose."""
        for candidates, by_node in self._cache.values():
            candidates[:] = [c for c in candidates if c.lease.lease_id not in lease_ids]
            for node, on_node in list(by_node.items()):
                kept = [c for c in on_node if c.lease.lease_id not in lease_ids]
                if kept:
                    by_node[node] = kept
                else:
                    del by_node[node]

    def plan(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        held: Mapping[str, int],
        now: float,
    ) -> VictimPlan | None:
        """Victims and the placement they make room for; `running` holds the running (not
        preempting) leases by quota entry."""
        if self._cache_at != now:
            self._cache.clear()
            self._cache_at = now
        my_key = self._book.key(request.team, request.workload_class) if self._quota_rules else None
        tag = (
            self._priority[request.priority_class].value,
            my_key,
            tuple(running),
            my_key is not None and self._book.reclaiming(my_key, request.gpus),
            request.workload_class is WorkloadClass.INFERENCE,
        )
        cached = self._cache.get(tag)
        if cached is None:
            candidates = self._candidates(request, running, now)
            by_node: dict[str, list[_Candidate]] = {}
            for c in candidates:
                for node in c.lease.gpus_by_node():
                    by_node.setdefault(node, []).append(c)
            cached = self._cache[tag] = (candidates, by_node)
        if not cached[0]:
            return None
        single = len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK
        if single:
            return self._plan_single_node(request, cached[1], held)
        return self._plan_multi_node(request, cached[1], held)

    def plan_escalation(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        held: Mapping[str, int],
        now: float,
    ) -> VictimPlan | None:
        """Victims for a gang past its second wait bound (`starvation.py`): running leases of a
        strictly lower priority class past their protection from priority preemption, of any
        team, borrowing or not. Not cached: at most one search per starving gang per retry."""
        mine = self._priority[request.priority_class].value
        out: list[_Candidate] = []
        for key, leases in running.items():
            for lease in leases.values():
                theirs = self._priority[lease.request.priority_class]
                if theirs.value < mine and may_preempt(lease, theirs, request, PreemptionReason.PRIORITY, now):
                    # Not `cross_team`: escalation takes it whatever its team's guarantee.
                    out.append(self._candidate(lease, key, False, PreemptionReason.PRIORITY, now))
        if not out:
            return None
        out.sort(key=self._order_key(self._policy.knobs.preemption))
        by_node: dict[str, list[_Candidate]] = {}
        for i, c in enumerate(out):
            c.position = i
            for node in c.lease.gpus_by_node():
                by_node.setdefault(node, []).append(c)
        if len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK:
            return self._plan_single_node(request, by_node, held)
        return self._plan_multi_node(request, by_node, held)

    # -- who ------------------------------------------------------------------------------
    def _candidates(
        self,
        request: GangRequest,
        running: Mapping[QuotaKey, Mapping[str, Lease]],
        now: float,
    ) -> list[_Candidate]:
        mode = self._policy.knobs.preemption
        mine = self._priority[request.priority_class].value
        my_key = self._book.key(request.team, request.workload_class) if self._quota_rules else None
        reclaiming = my_key is not None and self._book.reclaiming(my_key, request.gpus)
        out: list[_Candidate] = []
        for key, leases in running.items():
            cross = my_key is not None and key != my_key
            room = self._book.reclaimable(key) if cross else 0
            if cross and room == 0:
                continue  # never below its guarantee: a team that is not borrowing is off limits
            for lease in leases.values():
                theirs = self._priority[lease.request.priority_class]
                if not theirs.preemptible:
                    continue  # whatever its entry borrows through other classes (finding 6)
                by_priority = theirs.value < mine and may_preempt(
                    lease, theirs, request, PreemptionReason.PRIORITY, now
                )
                # `room` > 0 for another entry: the team borrows, and its gang goes whole.
                if cross and reclaiming and may_preempt(lease, theirs, request, PreemptionReason.RECLAIM, now):
                    out.append(self._candidate(lease, key, True, PreemptionReason.RECLAIM, now))
                elif by_priority:
                    out.append(self._candidate(lease, key, cross, PreemptionReason.PRIORITY, now))
        out.sort(key=self._order_key(mode))
        for i, c in enumerate(out):
            c.position = i
        return out

    @property
    def _quota_rules(self) -> bool:
        knobs = self._policy.knobs
        return knobs.enforce_quota and knobs.preemption is not PreemptionMode.PRIORITY

    def _candidate(self, lease: Lease, key: QuotaKey, cross: bool, reason: PreemptionReason, now: float) -> _Candidate:
        work = lease.lost_gpu_seconds(now)
        restart = lease.gpus * self._policy.knobs.restart_cost_s
        return _Candidate(lease, key, cross, reason, work + restart, work)

    def _order_key(self, mode: PreemptionMode) -> Callable[[_Candidate], tuple[float, int, float, str]]:
        def checkpoint_aware(c: _Candidate) -> tuple[float, int, float, str]:
            value = self._priority[c.lease.request.priority_class].value
            return (c.lost, value, -c.lease.started_at, c.lease.lease_id)

        def kueue(c: _Candidate) -> tuple[float, int, float, str]:
            value = self._priority[c.lease.request.priority_class].value
            return (0 if c.cross_team else 1, value, -c.lease.started_at, c.lease.lease_id)

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
        return self._book.reclaimable(c.key) - taken.get(c.key, 0) > 0

    # -- how many -------------------------------------------------------------------------
    def _plan_single_node(
        self, request: GangRequest, by_node: dict[str, list[_Candidate]], held: Mapping[str, int]
    ) -> VictimPlan | None:
        size = request.gpus
        best: tuple[tuple[float, float], str, list[_Candidate]] | None = None
        for node, on_node in by_node.items():
            spec = self._pool.node(node)
            if spec.gpus - held.get(node, 0) < size:
                continue
            if request.node_group is not None and spec.node_group != request.node_group:
                continue
            need = size - (self._pool.free(node) - held.get(node, 0))
            chosen: list[_Candidate] = []
            taken: dict[QuotaKey, int] = {}
            for c in on_node:
                if need <= 0:
                    break
                if not self._keeps_guarantee(c, taken):
                    continue
                chosen.append(c)
                taken[c.key] = taken.get(c.key, 0) + c.lease.gpus
                need -= c.lease.gpus_by_node()[node]
            if need > 0 or not chosen:
                continue
            cost = self._cost(chosen)
            if best is None or (cost, node) < (best[0], best[1]):
                best = (cost, node, chosen)
        if best is None:
            return None
        return VictimPlan(self._victims(best[2]), (best[1],) * len(request.bundles))

    def _plan_multi_node(
        self, request: GangRequest, by_node: dict[str, list[_Candidate]], held: Mapping[str, int]
    ) -> VictimPlan | None:
        if request.node_group is not None:
            scopes: list[list[str]] = [self._pool.group_nodes(request.node_group)]
        elif request.same_node_group:
            # Only groups whose free GPUs plus victims' GPUs could hold the gang at all.
            room: dict[str, int] = {g: self._pool.group_free(g) for g in self._pool.group_names()}
            for node, gpus in held.items():
                if node in self._pool:
                    room[self._pool.node(node).node_group] -= gpus
            for node, on_node in by_node.items():
                room[self._pool.node(node).node_group] += sum(c.lease.gpus_by_node()[node] for c in on_node)
            scopes = [self._pool.group_nodes(g) for g, r in room.items() if r >= request.gpus]
        else:
            scopes = [[n.name for n in self._pool.nodes()]]
        best: tuple[tuple[float, float], list[_Candidate], dict[str, int]] | None = None
        for names in scopes:
            plan = self._plan_in_scope(request, names, by_node, held)
            if plan is not None and (best is None or plan[0] < best[0]):
                best = plan
        if best is None:
            return None
        placement = self._find(request, held, best[2])
        if placement is None:
            return None
        return VictimPlan(self._victims(best[1]), placement)

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

    def _find(self, request: GangRequest, held: Mapping[str, int], bonus: Mapping[str, int]) -> tuple[str, ...] | None:
        return self._pool.find(
            request.bundles,
            request.strategy,
            same_node_group=request.same_node_group,
            node_group=request.node_group,
            held=held,
            bonus=bonus,
        )

    @staticmethod
    def _victims(chosen: list[_Candidate]) -> tuple[Victim, ...]:
        ordered = sorted(chosen, key=lambda c: c.position)
        return tuple(Victim(c.lease, c.reason, c.work_lost) for c in ordered)


def _add(into: dict[str, int], gpus_by_node: Mapping[str, int], sign: int) -> None:
    for node, gpus in gpus_by_node.items():
        into[node] = into.get(node, 0) + sign * gpus
        if into[node] == 0:
            del into[node]
