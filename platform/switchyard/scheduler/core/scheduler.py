"""The scheduler: events in, decisions out. The one authority over which gang gets which GPUs.

Every method takes `now` explicitly and nothing reads a clock, so the simulator and the live
Ray driver run the same code and a replay is deterministic. A driver calls `submit`,
`cancel`, `release`, `report_checkpoint`, `add_node`/`remove_node` as things happen, then
`schedule(now)` and carries out the returned `Decisions`.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from switchyard.scheduler.core import explain, gpu_types, victim_search
from switchyard.scheduler.core.fairshare import DecayedUsage
from switchyard.scheduler.core.holds import Holds, reservation_amounts
from switchyard.scheduler.core.model import (
    Decisions,
    GangRequest,
    HoldKind,
    Lease,
    LeaseStart,
    LeaseState,
    Node,
    PendingWorkload,
    PlacementStrategy,
    StopOrder,
    WorkloadClass,
    lease_name,
)
from switchyard.scheduler.core.pending import PendingExplanation
from switchyard.scheduler.core.placement import NodePool
from switchyard.scheduler.core.policy import Ordering, PreemptionMode, SchedulerPolicy
from switchyard.scheduler.core.preemption import VictimSelector
from switchyard.scheduler.core.queue import GroupKey, PendingQueues
from switchyard.scheduler.core.quota import NO_LENDABLE_CAPACITY, Admission, QuotaBook, QuotaKey
from switchyard.scheduler.core.request_checks import check_request
from switchyard.scheduler.core.snapshot import ClusterSnapshot, build_snapshot
from switchyard.scheduler.core.starvation import reservation_to_take
from switchyard.scheduler.core.team_order import HeldBack

_IMPLICIT_TYPE = ("",)  # the one GPU type of a policy that declares none


def _may_go_on(admission: Admission) -> bool:
    """Whether a request may go on to placement, preemption and a reservation on a type.
    Refused for want of lendable capacity, a borrower is blocked by capacity, not by its
    quota: like a gang that does not fit, it may preempt and reserve (finding 1). So is one
    within its guarantee whose cohort lent that guarantee out (it reclaims)."""
    return admission.allowed or admission.reason == NO_LENDABLE_CAPACITY or admission.reclaim


@dataclass(slots=True)
class _Pass:
    """Scratch state of one schedule() call."""

    max_attempts: int
    budget: list[int] = field(default_factory=list)
    failed_shapes: set[tuple[object, ...]] = field(default_factory=set)
    considered: set[str] = field(default_factory=set)
    nominal_only: bool = False
    """The first of two passes under `nominal_first`: requests that would borrow wait."""
    deferred: set[tuple[int, str, str]] = field(default_factory=set)
    """(priority, team, class) whose queue head waits for the second pass: so does the rest of
    that queue (Kueue considers one head per queue; nothing behind it goes first)."""
    held_back: HeldBack | None = None
    """Starving requests and the later requests of their teams they hold back (knob
    `starving_blocks_team`); None when the knob is off."""

    def __post_init__(self) -> None:
        self.budget = [self.max_attempts]


class Scheduler:
    def __init__(self, policy: SchedulerPolicy, nodes: Iterable[Node] = (), now: float = 0.0) -> None:
        self.policy = policy
        self._knobs = policy.knobs
        self._pool = NodePool(nodes)
        self._book = QuotaBook(policy.teams, policy.cohorts)
        weights = {t.name: t.weight for t in policy.teams}
        self._usage = DecayedUsage(weights, policy.knobs.usage_half_life_s, now)
        self._victims = VictimSelector(policy, self._book, self._pool)
        self._queues = PendingQueues()
        self._leases: dict[str, Lease] = {}
        self._lease_of: dict[str, str] = {}
        self._attempts: dict[str, int] = {}
        self._preemptions: dict[str, int] = {}  # workload -> notices it received (backoff)
        self._holds = Holds(self._pool)
        self._preempting: dict[str, Lease] = {}  # noticed leases, in notice order
        self._awaiting: dict[str, set[str]] = {}  # preemptor -> victim leases still holding GPUs
        self._stops: list[StopOrder] = []
        self._preemptible_gpus: dict[int, int] = {}  # priority value -> GPUs in running leases
        self._next_victim_search: dict[tuple[object, ...], float] = {}  # shape -> retry time
        self._running: dict[tuple[str, int], dict[str, Lease]] = {}  # quota entry -> leases
        self._unpreemptible: dict[str, int] = {}  # node -> GPUs of running non-preemptible leases
        self._priority = {p.name: p for p in policy.priority_classes}
        self._typed = bool(policy.gpu_types)
        self._types_of: dict[tuple[str, WorkloadClass, tuple[str, ...]], tuple[str, ...]] = {}  # a cache
        self._arriving_type: dict[str, str] = {}  # preemptor -> GPU type its victims free

    # -- events -------------------------------------------------------------------------------
    def submit(self, request: GangRequest, now: float) -> None:
        self._validate(request)
        if request.workload_id in self._queues or request.workload_id in self._lease_of:
            raise ValueError(f"workload {request.workload_id!r} is already submitted")
        self._enqueue(PendingWorkload(request, submitted_at=now, queued_at=now))

    def cancel(self, workload_id: str, now: float) -> None:
        """Withdraw a pending workload, or ask for a running one to be stopped."""
        if workload_id in self._queues:
            pending = self._queues.remove(workload_id)
            self._drop_reservation(workload_id)
            self._stop_awaiting(pending.request)
        elif workload_id in self._lease_of:
            lease = self._leases[self._lease_of[workload_id]]
            self._stops.append(StopOrder(lease.lease_id, workload_id, "cancelled"))
        else:
            raise KeyError(f"unknown workload {workload_id!r}")

    def release(self, lease_id: str, now: float, *, finished: bool = False) -> bool:
        """The lease's GPUs are free again. Returns True when its workload was requeued
        (it was being preempted and had not finished)."""
        lease = self._leases.pop(lease_id)
        del self._lease_of[lease.request.workload_id]
        self._preempting.pop(lease_id, None)
        self._free_lease(lease, now)
        for waiting in self._awaiting.values():
            waiting.discard(lease_id)
        if lease.state is LeaseState.PREEMPTING and not finished:
            self._enqueue(
                PendingWorkload(
                    lease.request,
                    lease.submitted_at,
                    lease.submitted_at,
                    attempts=self._attempts[lease.request.workload_id],
                )
            )
            return True
        return False

    def report_checkpoint(self, workload_id: str, now: float) -> None:
        lease = self._leases[self._lease_of[workload_id]]
        # Only lost-work accounting. A checkpoint reported after a notice is no reason to end the
        # lease early: it may be a periodic one that was already being written when the notice
        # went out, from a job that has not seen the notice yet. Ending the lease then (as an
        # earlier version did) freed GPUs the job still held; the demo caught the double booking.
        # The job releases its lease itself once it has checkpointed and exited; the grace
        # period bounds the wait.
        lease.last_checkpoint_at = now
        self._victims.checkpointed(lease)

    def add_node(self, node: Node, now: float) -> None:
        self._pool.add(node)
        self._retarget_reservations()

    def remove_node(self, name: str, now: float) -> list[str]:
        """Take a node out; returns the leases that lost GPUs on it (requeued here; the driver
        must treat them as stopped and not call release for them)."""
        lost = [lease for lease in self._leases.values() if name in lease.placement]
        for lease in lost:
            if lease.state is LeaseState.RUNNING:
                self._count_preemptible(lease, -1)
                lease.state = LeaseState.PREEMPTING  # so release() requeues it
            self.release(lease.lease_id, now)
        for workload in self._holds.on_node(name):
            self._drop_reservation(workload)
            if workload in self._queues:
                self._stop_awaiting(self._queues.get(workload).request)
        self._pool.remove(name)
        self._retarget_reservations()
        return [lease.lease_id for lease in lost]

    def _retarget_reservations(self) -> None:
        """Nodes changed: blocked gangs choose their reserved nodes afresh in the next decision
        (preemptors keep theirs: their victims are already leaving)."""
        for workload, kind in self._holds.kinds().items():
            if kind is not HoldKind.PREEMPTOR:
                self._drop_reservation(workload)

    def adopt(self, request: GangRequest, placement: tuple[str, ...], now: float) -> LeaseStart:
        """Record as a lease a workload that already runs where something else put it (a Serve
        replica that Ray placed itself), bundle i on node `placement[i]`. Allowed only onto
        GPUs free in the ledger and within the workload's quota, so adopting never grants a
        GPU twice; a queued workload of that id leaves the queue. Raises ValueError naming what
        is wrong otherwise."""
        self._validate(request)
        workload = request.workload_id
        if workload in self._lease_of:
            raise ValueError(f"workload {workload!r} already holds lease {self._lease_of[workload]!r}")
        if len(placement) != len(request.bundles):
            raise ValueError(f"workload {workload!r}: {len(placement)} nodes for {len(request.bundles)} bundles")
        need: dict[str, int] = {}
        for node, size in zip(placement, request.bundles, strict=True):
            need[node] = need.get(node, 0) + size
        for node, gpus in need.items():
            if node not in self._pool:
                raise ValueError(f"workload {workload!r}: unknown node {node!r}")
            if self._pool.free(node) < gpus:
                raise ValueError(
                    f"workload {workload!r}: node {node!r} has {self._pool.free(node)} GPUs free in the "
                    f"ledger, {gpus} needed"
                )
        gpu_type = self._pool.node(placement[0]).gpu_type if self._typed else ""
        if self._typed and (
            any(self._pool.node(n).gpu_type != gpu_type for n in need) or gpu_type not in self._types(request)
        ):
            raise ValueError(
                f"workload {workload!r}: nodes {sorted(need)} are not all of one of its GPU types "
                f"{list(self._types(request))}"
            )
        admission = self._admission(request, gpu_type=gpu_type)
        if not admission.allowed:
            raise ValueError(f"workload {workload!r}: over the quota of team {request.team!r} ({admission.reason})")
        if workload in self._queues:
            pending = self._queues.get(workload)
        else:
            pending = PendingWorkload(request, submitted_at=now, queued_at=now)
            self._enqueue(pending)
        decisions = Decisions()
        self._start(pending, placement, admission.borrowing, now, decisions, gpu_type)
        return decisions.starts[0]

    def __setstate__(self, state: dict[str, object]) -> None:
        """A core pickled by an older version (the live scheduler's journal) lacks the hold
        counts kept since: they are rebuilt from the holds, which every version records. The
        victim index (older versions kept a per-decision cache in its place) and the
        non-preemptible GPUs per node are rebuilt from the running leases whatever the version."""
        self.__dict__.update(state)
        if "_holds" not in state:  # pickled before holds were their own object
            self._holds = Holds.from_core_fields(self.__dict__)
        if "_typed" not in state:
            self._typed = False
            self._types_of = {}
            self._arriving_type = {}
        self._victims = VictimSelector(self.policy, self._book, self._pool)
        self._unpreemptible = {}
        for key, leases in self._running.items():
            for lease in leases.values():
                self._victims.track(lease, key)
                self._count_unpreemptible(lease, +1)

    # -- the decision -------------------------------------------------------------------------
    def schedule(self, now: float) -> Decisions:
        decisions = Decisions()
        self._due_stops(now, decisions)
        state = _Pass(self._knobs.max_preemption_attempts)
        if self._knobs.starving_blocks_team:
            held_back = self._held_back_at(now)
            state.held_back = held_back or None  # nothing starves (the common case): no checks
        # Gangs holding reservations (blocked heads, starving gangs, preemptors) start first
        # where their holds let them: backfill must never take GPUs made ready for them.
        for workload in list(self._holds):
            if workload not in self._queues:
                continue
            pending = self._queues.get(workload)
            if self._held_back(pending, state):
                continue
            if self._start_reserved(pending, now, decisions):
                state.considered.add(workload)
                if state.held_back is not None:
                    state.held_back.started(pending, self._queues.heads)
        if self._knobs.nominal_first:
            state.nominal_only = True
            for level in self._queues.levels():
                if self._run_level(level, now, decisions, state) == "halt":
                    return self._finish(decisions)
            state.nominal_only = False
        for level in self._queues.levels():
            if self._run_reserved(level, now, decisions, state) == "halt":
                break
            if self._pool.free_gpus == 0 and not victim_search.may_preempt_for(self, level, state.budget):
                continue  # nothing can start at this level: no free GPUs and no victims
            if self._run_level(level, now, decisions, state) == "halt":
                break
        return self._finish(decisions)

    def _run_reserved(self, level: int, now: float, decisions: Decisions, state: _Pass) -> str:
        """The rest of `level`'s reserved gangs (victim searches, escalation) go before the rest
        of their level, but after every higher level: the searches of many starving gangs must
        not use up the budget that inference reclaim (or any higher priority) needs."""
        for workload in [w for w in self._holds if w in self._queues and self._queues.level_of(w) == level]:
            if workload in state.considered:
                continue
            state.considered.add(workload)
            if self._consider(self._queues.get(workload), now, decisions, state) == "halt":
                return "halt"
        return "done"

    def _start_reserved(self, pending: PendingWorkload, now: float, decisions: Decisions) -> bool:
        """Start a reserved gang if it fits now, without any victim search."""
        request = pending.request
        if self._awaiting.get(request.workload_id):
            return False
        admissions = self._admissions(request)
        if not any(a.allowed for _, a in admissions):
            return False
        waived = self._holds.waived_for(request.workload_id, self._value(request))
        for gpu_type, admission in self._fit_order(admissions):
            if not admission.allowed:
                continue
            placement = self._find(request, self._holds.per_node, waived, gpu_type)
            if placement is not None:
                self._start(pending, placement, admission.borrowing, now, decisions, gpu_type)
                return True
        return False

    def _finish(self, decisions: Decisions) -> Decisions:
        decisions.reservations = self._holds.reservations()
        return decisions

    def _run_level(self, level: int, now: float, decisions: Decisions, state: _Pass) -> str:
        """Admission order within one priority level, one request group at a time."""
        groups = self._queues.groups_at(level)
        heap = [(self._order_key(g[0], g[1][0], now), i) for i, g in enumerate(groups)]
        heapq.heapify(heap)
        position = [0] * len(groups)
        while heap:
            key, index = heapq.heappop(heap)
            items = groups[index][1]
            i = position[index]
            while i < len(items) and items[i].request.workload_id in state.considered:
                i += 1
            if i >= len(items):
                continue
            position[index] = i
            fresh = self._order_key(groups[index][0], items[i], now)
            if fresh > key:  # its team's share grew since it was queued in the heap
                heapq.heappush(heap, (fresh, index))
                continue
            outcome = self._consider(items[i], now, decisions, state)
            if state.nominal_only and outcome != "defer":
                state.considered.add(items[i].request.workload_id)  # done with it this decision
            if outcome == "halt":
                return "halt"
            if outcome in ("started", "preempting", "waiting") and i + 1 < len(items):
                position[index] = i + 1
                heapq.heappush(heap, (self._order_key(groups[index][0], items[i + 1], now), index))
            # "blocked" / "skip" / "defer": every later request of this group would be too.
        return "done"

    def _order_key(self, group: GroupKey, head: PendingWorkload, now: float) -> tuple[object, ...]:
        if self._knobs.ordering is Ordering.FAIR_SHARE:
            aging = self._knobs.starvation_after_s
            if aging is not None and now - head.submitted_at > aging:
                return (0, head.submitted_at, head.request.workload_id)  # starving: oldest first
            # Lowest weighted decayed share first; within a team, queue time.
            return (1, self._usage.share(group[1], now), head.queued_at, head.request.workload_id)
        return (head.queued_at, head.request.workload_id)

    def _consider(self, pending: PendingWorkload, now: float, decisions: Decisions, state: _Pass) -> str:
        held_back = state.held_back
        if held_back is None:
            return self._consider_request(pending, now, decisions, state)
        if self._held_back(pending, state):
            return "skip"  # an older starving request of its team goes first
        outcome = self._consider_request(pending, now, decisions, state)
        if outcome == "started":
            held_back.started(pending, self._queues.heads)
        return outcome

    def _held_back(self, pending: PendingWorkload, state: _Pass) -> bool:
        """Whether an older starving request of its team holds `pending` back this decision
        (`core.team_order`): only while it would borrow on every GPU type it may take (within
        its guarantee a team's work goes on). A held-back gang gives up a blocked-head or
        starving reservation, so that the request holding it back may take one; a preemptor
        keeps its hold (its victims are already leaving for it) and is never held back."""
        if state.held_back is None:
            return False
        workload = pending.request.workload_id
        kind = self._holds.kind_of(workload)
        if kind is HoldKind.PREEMPTOR or not self._team_order_holds(state.held_back, pending):
            return False
        if kind is not None:
            self._drop_reservation(workload)
        return True

    def _consider_request(self, pending: PendingWorkload, now: float, decisions: Decisions, state: _Pass) -> str:
        request = pending.request
        workload = request.workload_id
        if self._awaiting.get(workload):
            return "waiting"  # its victims still hold the GPUs reserved for it
        waived = self._holds.waived_for(workload, self._value(request))
        admissions = self._admissions(request)
        if state.nominal_only:
            line = (self._value(request), request.team, request.workload_class.value)
            if all(a.borrowing for _, a in admissions) or line in state.deferred:
                state.deferred.add(line)
                return "defer"  # it would borrow (or waits behind one that would): second pass
        if len(admissions) == 1:  # every request of an untyped policy: no list to build
            open_types = admissions if _may_go_on(admissions[0][1]) else []
        else:
            open_types = [ta for ta in admissions if _may_go_on(ta[1])]
        if not open_types:
            # Over quota: only its own team's lower-priority work can make room for it.
            if workload not in self._awaiting:
                for gpu_type, _ in admissions:
                    if victim_search.try_preempt(
                        self, pending, waived, now, decisions, state.budget, state.failed_shapes, True, gpu_type
                    ):
                        return "preempting"
            return "skip"
        room = self._pool.free_gpus if waived else self._holds.open_gpus()
        if room >= request.gpus:
            for gpu_type, admission in open_types if len(open_types) == 1 else self._fit_order(open_types):
                if not admission.allowed:
                    continue
                placement = self._find(request, self._holds.per_node, waived, gpu_type)
                if placement is not None:
                    self._start(pending, placement, admission.borrowing, now, decisions, gpu_type)
                    return "started"
        if workload in self._awaiting:
            return "waiting"
        # Kueue's whenCanPreempt default (TryNextFlavor): preempt only once no type fits as is.
        for gpu_type, _ in open_types:
            if victim_search.try_preempt(
                self, pending, waived, now, decisions, state.budget, state.failed_shapes, False, gpu_type
            ):
                return "preempting"
        for gpu_type, _ in open_types:
            if victim_search.try_escalate(self, pending, waived, now, decisions, state.budget, gpu_type):
                return "preempting"
        kind = reservation_to_take(pending, self._knobs, now, self._holds.kind_of(workload), self._holds.counts)
        if kind is not None:
            self._drop_reservation(workload)  # a blocked head that starves moves to its own slot
            self._reserve(request, kind, open_types[0][0])
        else:
            have = self._holds.kind_of(workload)
            if have is HoldKind.BLOCKED_HEAD or have is HoldKind.STARVING:
                self._move_reservation(request, have, open_types[0][0])
        if not self._knobs.backfill:
            return "halt"
        if self._pool.free_gpus == 0 and (state.budget[0] <= 0 or self._knobs.preemption is PreemptionMode.NONE):
            return "halt"
        return "blocked"

    def _admission(
        self, request: GangRequest, freed: Mapping[QuotaKey, int] | None = None, gpu_type: str = ""
    ) -> Admission:
        """The quota check for `request` on `gpu_type` (always allowed when quotas are off),
        once `freed` GPUs per quota entry have left."""
        if not self._knobs.enforce_quota:
            return Admission(True, False)
        may_borrow = self._knobs.borrowing and self._priority[request.priority_class].preemptible
        capacity = self._pool.type_gpus(gpu_type) if self._typed else self._pool.total_gpus
        return self._book.check(self._key(request, gpu_type), request.gpus, capacity, may_borrow, freed or {})

    def _admissions(self, request: GangRequest) -> list[tuple[str, Admission]]:
        """The quota check on each GPU type it may take, in its order of preference."""
        if not self._typed:
            return [("", self._admission(request))]
        return [(t, self._admission(request, gpu_type=t)) for t in self._types(request)]

    def _fit_order(self, admissions: list[tuple[str, Admission]]) -> list[tuple[str, Admission]]:
        return gpu_types.fit_order(admissions, self._knobs.when_can_borrow)

    def _on_type(self, request: GangRequest, gpu_type: str) -> GangRequest:
        return gpu_types.on_type(request, gpu_type, self._typed)

    def _types(self, request: GangRequest) -> tuple[str, ...]:
        return gpu_types.request_types(self.policy, request, self._types_of) if self._typed else _IMPLICIT_TYPE

    def _due_stops(self, now: float, decisions: Decisions) -> None:
        decisions.stops.extend(self._stops)
        self._stops.clear()
        for lease in self._preempting.values():
            if lease.stop_sent:
                continue
            assert lease.stop_deadline is not None
            if now < lease.stop_deadline:
                continue
            reason = "grace period over"
            lease.stop_sent = True
            decisions.stops.append(StopOrder(lease.lease_id, lease.request.workload_id, reason))

    # -- placement, reservations, preemption --------------------------------------------------
    def _find(
        self, request: GangRequest, held: dict[str, int], waived: dict[str, int], gpu_type: str = ""
    ) -> tuple[str, ...] | None:
        if max(request.bundles) > self._pool.max_free():
            return None
        if self._typed:  # inline: this runs for every request a decision considers
            held = self._pool.held_for_type(gpu_type, held)
        if waived:
            # Another gang's reservation is passed only where nothing else fits: a higher
            # priority may go first, but not undo the GPUs a reserved gang has gathered.
            own = self._holds.amounts().get(request.workload_id, {})
            # (Skipped when the free GPUs nothing else holds are too few: a full cluster.)
            if own != waived and self._holds.open_gpus() + sum(own.values()) >= request.gpus:
                placement = self._pool.find_gang(request, held, own)
                if placement is not None:
                    return placement
        return self._pool.find_gang(request, held, waived)

    def _typed_held(self, held: dict[str, int], gpu_type: str) -> dict[str, int]:
        """`held` as a search confined to `gpu_type` sees it (other types' nodes held whole)."""
        return self._pool.held_for_type(gpu_type, held) if self._typed else held

    def _reserve(self, request: GangRequest, kind: HoldKind, gpu_type: str = "") -> None:
        held = self._held_for_reservation(self._holds.per_node, gpu_type)
        amounts = reservation_amounts(self._pool, request, held, gpu_type if self._typed else None)
        if amounts is not None:
            self._holds.add(request, self._value(request), amounts, kind)

    def _held_for_reservation(self, held_by_holds: dict[str, int], gpu_type: str) -> dict[str, int]:
        # GPUs nothing will free early count as held: immune settled leases, and non-preemptible
        # ones (inference replicas may run for weeks: a gang reserved beside them waited).
        held = dict(self._victims.settled.pinned(self._typed_held(held_by_holds, gpu_type)))
        for node, gpus in self._unpreemptible.items():
            held[node] = held.get(node, 0) + gpus
        return held

    def _move_reservation(self, request: GangRequest, kind: HoldKind, gpu_type: str) -> None:
        """Move a blocked gang's reservation to the nodes closest to fitting it once they would
        hold `reservation_move_gpus` more free GPUs than its own nodes: those may run jobs for
        days. Each move gains at least that many, so small changes in free GPUs do not move it
        back and forth."""
        margin = self._knobs.reservation_move_gpus
        if margin is None:
            return
        own = self._holds.amounts()[request.workload_id]
        pool = self._pool
        has = 0  # what its own nodes have gathered: free GPUs nothing else holds or pins there
        for node, gpus in own.items():
            if self._typed and pool.node(node).gpu_type != gpu_type:
                continue  # held on a type it no longer takes first: nothing gathered for it
            others = self._holds.per_node.get(node, 0) - gpus
            pinned = self._victims.settled.immune_on(node) + self._unpreemptible.get(node, 0)
            has += self._gathered(node, gpus, others + pinned)
        # The most any nodes could gather, from the free counts alone: most decisions stop here,
        # before the search below (a sort of every node) runs.
        one_node = len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK
        cap = request.gpus if one_node else max(request.bundles)
        if sum(min(free, cap) for free in pool.top_free(1 if one_node else len(request.bundles))) < has + margin:
            return
        held = self._held_for_reservation(self._holds.held_without(own), gpu_type)
        amounts = reservation_amounts(pool, request, held, gpu_type if self._typed else None)
        if amounts is None or amounts == own:
            return
        if sum(self._gathered(n, g, held.get(n, 0)) for n, g in amounts.items()) >= has + margin:
            self._holds.add(request, self._value(request), amounts, kind)

    def _gathered(self, node: str, gpus: int, held_there: int) -> int:
        """Of `gpus` a hold takes on `node`, how many are free with nothing else holding them."""
        return min(max(self._pool.free(node) - held_there, 0), gpus)

    def _drop_reservation(self, workload_id: str) -> None:
        self._holds.drop(workload_id)

    # -- bookkeeping ---------------------------------------------------------------------------
    def _start(
        self,
        pending: PendingWorkload,
        placement: tuple[str, ...],
        borrowing: bool,
        now: float,
        decisions: Decisions,
        gpu_type: str = "",
    ) -> None:
        request = pending.request
        workload = request.workload_id
        self._queues.remove(workload)
        self._drop_reservation(workload)
        for searched in self._types(request):
            self._next_victim_search.pop(("escalate", workload, searched), None)
        self._stop_awaiting(request)
        attempt = self._attempts.get(workload, 0) + 1
        self._attempts[workload] = attempt
        lease = Lease(
            lease_name(workload, attempt),
            request,
            placement,
            now,
            pending.submitted_at,
            borrowing,
            prior_preemptions=self._preemptions.get(workload, 0),
            gpu_type=gpu_type,
        )
        for node, size in zip(placement, request.bundles, strict=True):
            self._holds.node_change(node, gpus_freed=-size)
        self._book.charge(self._key(request, gpu_type), request.gpus)
        self._usage.change(request.team, request.gpus, now)
        self._leases[lease.lease_id] = lease
        self._lease_of[workload] = lease.lease_id
        self._count_preemptible(lease, +1)
        decisions.starts.append(LeaseStart(lease.lease_id, workload, request.team, placement, borrowing, gpu_type))

    def _stop_awaiting(self, request: GangRequest) -> None:
        if self._awaiting.pop(request.workload_id, None) is None:
            return
        gpu_type = self._arriving_type.pop(request.workload_id, "")
        if self._knobs.enforce_quota:
            self._book.mark_arriving(self._key(request, gpu_type), -request.gpus)

    def _value(self, request: GangRequest) -> int:
        return self._priority[request.priority_class].value

    def _held_back_at(self, now: float) -> HeldBack:
        """The team order at `now` (`core.team_order`): starving queue heads that capacity, not
        their quota, blocks on some GPU type they may take."""
        held_back = HeldBack(
            self._knobs,
            self._pending_value,
            lambda p: any(_may_go_on(a) for _, a in self._admissions(p.request)),
            now,
        )
        held_back.add_heads(self._queues.heads())
        return held_back

    def _team_order_holds(self, held_back: HeldBack, pending: PendingWorkload) -> bool:
        """`pending` waits for an older starving request of its team and would borrow on every
        GPU type it may take."""
        if not held_back.holds_back(pending):
            return False
        return not any(a.allowed and not a.borrowing for _, a in self._admissions(pending.request))

    def _pending_value(self, pending: PendingWorkload) -> int:
        return self._priority[pending.request.priority_class].value

    def _key(self, request: GangRequest, gpu_type: str = "") -> QuotaKey:
        return self._book.key(request.team, request.workload_class, gpu_type)

    def _lease_key(self, lease: Lease) -> QuotaKey:
        return self._book.key(lease.request.team, lease.request.workload_class, lease.gpu_type)

    def _free_lease(self, lease: Lease, now: float) -> None:
        request = lease.request
        if lease.state is LeaseState.PREEMPTING and lease.notice_at is not None and self._knobs.enforce_quota:
            self._book.mark_leaving(self._lease_key(lease), -lease.gpus)
        for node, size in zip(lease.placement, request.bundles, strict=True):
            self._holds.node_change(node, gpus_freed=size)
        self._book.charge(self._lease_key(lease), -request.gpus)
        self._usage.change(request.team, -request.gpus, now)
        if lease.state is LeaseState.RUNNING:
            self._count_preemptible(lease, -1)

    def _count_preemptible(self, lease: Lease, sign: int) -> None:
        """Track a lease entering (+1) or leaving (-1) the running, victim-eligible set."""
        key = self._lease_key(lease)
        if sign > 0:
            self._running.setdefault(key, {})[lease.lease_id] = lease
            self._victims.track(lease, key)
        else:
            del self._running[key][lease.lease_id]
            if not self._running[key]:
                del self._running[key]
            self._victims.untrack(lease)
        priority = self._priority[lease.request.priority_class]
        if priority.preemptible:
            self._preemptible_gpus[priority.value] = self._preemptible_gpus.get(priority.value, 0) + sign * lease.gpus
        self._count_unpreemptible(lease, sign)

    def _count_unpreemptible(self, lease: Lease, sign: int) -> None:
        if self._priority[lease.request.priority_class].preemptible:
            return
        for node, gpus in lease.gpus_by_node().items():
            left = self._unpreemptible.get(node, 0) + sign * gpus
            if left:
                self._unpreemptible[node] = left
            else:
                del self._unpreemptible[node]

    def _enqueue(self, pending: PendingWorkload) -> None:
        # FIFO ignores priority: one level for everything.
        value = 0 if self._knobs.ordering is Ordering.FIFO else (self._priority[pending.request.priority_class].value)
        self._queues.add(value, pending)

    def _validate(self, request: GangRequest) -> None:
        check_request(request, self.policy, self._typed, lambda: self._types(request))

    # -- read-only views ----------------------------------------------------------------------
    @property
    def pool(self) -> NodePool:
        return self._pool

    def leases(self) -> dict[str, Lease]:
        return dict(self._leases)

    def lease_of(self, workload_id: str) -> Lease | None:
        lease_id = self._lease_of.get(workload_id)
        return None if lease_id is None else self._leases[lease_id]

    def pending(self) -> list[PendingWorkload]:
        return list(self._queues.items())

    def is_queued(self, workload_id: str) -> bool:
        return workload_id in self._queues

    def pending_count(self) -> int:
        return len(self._queues)

    def reservations(self) -> dict[str, dict[str, int]]:
        return {w: dict(r) for w, r in self._holds.amounts().items()}

    def team_usage(self, team: str) -> int:
        return self._book.team_usage(team)

    def snapshot(self, now: float, *, explain_pending: bool = True) -> ClusterSnapshot:
        """`explain_pending`: give every pending workload its reason (a placement search each:
        for operators and reports, not for what runs every tick)."""
        queued = list(self._queues.items())
        explained = None
        if explain_pending:
            explainer = self.explainer(now)
            explained = [(p, explainer(p)) for p in queued]
        return build_snapshot(
            self.policy,
            self._pool,
            self._book,
            self._usage,
            self._leases,
            queued,
            explained,
            self._holds.amounts(),
            now,
        )

    def explain_pending(self, pending: PendingWorkload, now: float | None = None) -> PendingExplanation:
        """Why `pending` has not started, judged on the state now (`core.explain`); with `now`,
        the team order (`starving_blocks_team`) too."""
        return self.explainer(now)(pending)

    def explainer(self, now: float | None) -> Callable[[PendingWorkload], PendingExplanation]:
        """`explain_pending` for many requests at `now`: the team order is found once."""
        held_back = self._held_back_at(now) if now is not None and self._knobs.starving_blocks_team else None
        return lambda pending: explain.explain_pending(self, pending, held_back)

    def waiting_for_capacity(self) -> list[explain.CapacityNeed]:
        """Queued gangs that more GPUs (of a type) would let start (`core.explain`): what a
        driver asks an autoscaler for."""
        return explain.waiting_for_capacity(self)
