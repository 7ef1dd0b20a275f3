"""Preemption from the scheduler's side: whether a blocked request may still look for victims
in this decision (a per-decision budget of searches, a retry time per request shape), the
search, the quota check once its victims would have left, and the notices that follow.

Which leases may be victims, and in which order, is `core.preemption`. Like `cordon` and
`explain`, these functions work on `Scheduler`'s private state (kept out of `scheduler.py`,
which holds the decision's order); mypy checks every name used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchyard.scheduler.core.model import (
    Decisions,
    GangRequest,
    HoldKind,
    Lease,
    LeaseState,
    PendingWorkload,
    PreemptionDecision,
)
from switchyard.scheduler.core.policy import PreemptionMode
from switchyard.scheduler.core.preemption import VictimPlan
from switchyard.scheduler.core.quota import QuotaKey
from switchyard.scheduler.core.starvation import may_escalate

if TYPE_CHECKING:
    from switchyard.scheduler.core.scheduler import Scheduler


def try_preempt(
    core: Scheduler,
    pending: PendingWorkload,
    waived: dict[str, int],
    now: float,
    decisions: Decisions,
    budget: list[int],
    failed_shapes: set[tuple[object, ...]],
    own_entry_only: bool = False,
    gpu_type: str = "",
) -> bool:
    """Look for victims that make room for `pending` on `gpu_type` (of its own quota entry
    only, when `own_entry_only`: it is over its quota, so only its team's lower priorities can
    make room), and notice them. One search of the decision's `budget`; a shape that found
    nothing is not searched again this decision (`failed_shapes`) nor before
    `preemption_retry_s`."""
    request = pending.request
    if core._knobs.preemption is PreemptionMode.NONE or budget[0] <= 0:
        return False
    shape = (
        request.team,
        request.workload_class,
        request.priority_class,
        request.bundles,
        request.strategy,
        request.same_node_group,
        request.node_group,
        own_entry_only,
        gpu_type,
    )
    if shape in failed_shapes or now < core._next_victim_search.get(shape, now):
        return False
    if not _victims_may_exist(core, request, gpu_type):
        return False
    budget[0] -= 1
    held = core._typed_held(core._holds.held_without(waived), gpu_type)
    running = core._running
    if own_entry_only:
        key = core._key(request, gpu_type)
        running = {key: core._running[key]} if key in core._running else {}
    else:
        running = _that_can_make_room(core, request, gpu_type)
    plan = core._victims.plan(core._on_type(request, gpu_type), running, held, now)
    if plan is not None and not core._admission(request, _freed_by_entry(core, plan), gpu_type).allowed:
        plan = None  # room on the nodes, but its quota would still refuse it
    if plan is None:
        # Same-shaped requests would find the same nothing; look again after a while.
        failed_shapes.add(shape)
        core._next_victim_search[shape] = now + core._knobs.preemption_retry_s
        return False
    _notify(core, request, plan, now, decisions, gpu_type)
    return True


def try_escalate(
    core: Scheduler,
    pending: PendingWorkload,
    waived: dict[str, int],
    now: float,
    decisions: Decisions,
    budget: list[int],
    gpu_type: str = "",
) -> bool:
    """A gang past the second wait bound preempts strictly lower-priority work of any team."""
    request = pending.request
    if core._knobs.preemption is PreemptionMode.NONE or budget[0] <= 0:
        return False
    if not may_escalate(pending, core._knobs, now):
        return False
    search = ("escalate", request.workload_id, gpu_type)
    if now < core._next_victim_search.get(search, now):
        return False
    budget[0] -= 1
    held = core._typed_held(core._holds.held_without(waived), gpu_type)
    plan = core._victims.plan_escalation(request, core._running, held, now)
    if plan is not None and not core._admission(request, _freed_by_entry(core, plan), gpu_type).allowed:
        plan = None
    if plan is None:
        core._next_victim_search[search] = now + core._knobs.preemption_retry_s
        return False
    _notify(core, request, plan, now, decisions, gpu_type)
    return True


def _that_can_make_room(core: Scheduler, request: GangRequest, gpu_type: str) -> dict[QuotaKey, dict[str, Lease]]:
    """The running leases whose leaving can admit `request`: all of them, except for a request
    within its guarantee that a cohort's borrowing limit refuses (it reclaims what the cohort
    lent out): then only the cohort members'. Searching all, it found the cheapest victims
    outside the cohort, whose leaving left the cohort as far over its limit, and gave up."""
    if not core.policy.cohorts:
        return core._running
    admission = core._admission(request, gpu_type=gpu_type)
    if admission.cohort is None:
        return core._running
    members = core._book.members(admission.cohort)
    return {key: leases for key, leases in core._running.items() if key in members}


def _freed_by_entry(core: Scheduler, plan: VictimPlan) -> dict[QuotaKey, int]:
    freed: dict[QuotaKey, int] = {}
    for victim in plan.victims:
        key = core._lease_key(victim.lease)
        freed[key] = freed.get(key, 0) + victim.lease.gpus
    return freed


def may_preempt_for(core: Scheduler, level: int, budget: list[int]) -> bool:
    """Whether any request at priority `level` may still find victims this decision."""
    if core._knobs.preemption is PreemptionMode.NONE or budget[0] <= 0:
        return False
    if any(g > 0 for v, g in core._preemptible_gpus.items() if v < level):
        return True
    return core._knobs.enforce_quota and core._knobs.preemption is not PreemptionMode.PRIORITY


def _victims_may_exist(core: Scheduler, request: GangRequest, gpu_type: str = "") -> bool:
    """Cheap upper bound on victim GPUs, so hopeless searches are skipped."""
    mine = core._value(request)
    lower = sum(g for v, g in core._preemptible_gpus.items() if v < mine)
    if lower >= request.gpus:
        return True
    if not core._knobs.enforce_quota or core._knobs.preemption is PreemptionMode.PRIORITY:
        return False
    if core._book.reclaiming(core._key(request, gpu_type), request.gpus):
        return True
    return core._victims.may_reclaim_fairly(core._on_type(request, gpu_type), core._running)


def _notify(
    core: Scheduler, request: GangRequest, plan: VictimPlan, now: float, decisions: Decisions, gpu_type: str = ""
) -> None:
    deadline = now + core._knobs.preemption_grace_s
    waiting: set[str] = set()
    for rank, victim in enumerate(plan.victims):
        lease = victim.lease
        lease.state = LeaseState.PREEMPTING
        core._preempting[lease.lease_id] = lease
        lease.notice_at = now
        lease.stop_deadline = deadline
        workload = lease.request.workload_id
        core._preemptions[workload] = core._preemptions.get(workload, 0) + 1
        core._count_preemptible(lease, -1)
        if core._knobs.enforce_quota:
            core._book.mark_leaving(core._lease_key(lease), lease.gpus)
        waiting.add(lease.lease_id)
        decisions.notices.append(
            PreemptionDecision(
                lease.lease_id,
                lease.request.workload_id,
                victim.reason,
                request.workload_id,
                rank,
                deadline,
                victim.lost_gpu_seconds,
            )
        )
    amounts: dict[str, int] = {}
    for node, size in zip(plan.placement, request.bundles, strict=True):
        amounts[node] = amounts.get(node, 0) + size
    # The victims' GPUs go to this gang, not to backfill.
    core._holds.add(request, core._value(request), amounts, HoldKind.PREEMPTOR)
    core._awaiting[request.workload_id] = waiting
    core._arriving_type[request.workload_id] = gpu_type
    if core._knobs.enforce_quota:
        core._book.mark_arriving(core._key(request, gpu_type), request.gpus)
