"""Why a pending workload waits, and which waiting gangs more capacity would start: read-only
judgements over the scheduler's state (`Scheduler.explain_pending`, `waiting_for_capacity`).

Kept out of `scheduler.py` so that module holds the decisions only; like `cordon`, these read
`Scheduler`'s private state, and mypy checks every name used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.scheduler.core.model import GangRequest, PendingWorkload
from switchyard.scheduler.core.pending import PendingExplanation, PendingReason, furthest
from switchyard.scheduler.core.quota import NO_LENDABLE_CAPACITY

if TYPE_CHECKING:
    from switchyard.scheduler.core.scheduler import Scheduler
    from switchyard.scheduler.core.team_order import HeldBack


def explain_pending(core: Scheduler, pending: PendingWorkload, held_back: HeldBack | None = None) -> PendingExplanation:
    """Why `pending` has not started (see core.pending). A request that may take several GPU
    types gets the reason of the type it came closest on, and a detail naming each type's.
    `held_back`: the team order of the moment (`Scheduler.explainer`), None to leave it out."""
    request = pending.request
    workload = request.workload_id
    if core._awaiting.get(workload):
        return PendingExplanation(PendingReason.PREEMPTING, f"{len(core._awaiting[workload])} victim(s) leaving")
    if held_back is not None and core._team_order_holds(held_back, pending):
        return PendingExplanation(
            PendingReason.TEAM_ORDER, f"an older request of team {request.team} is starving and goes first"
        )
    if not core._typed:
        return _explain_on(core, request, "")
    per_type = [(t, _explain_on(core, request, t)) for t in core._types(request)]
    best = furthest([why for _, why in per_type])
    detail = "; ".join(f"{t}: {why.reason.value} ({why.detail})" for t, why in per_type)
    return PendingExplanation(best.reason, detail)


def _explain_on(core: Scheduler, request: GangRequest, gpu_type: str) -> PendingExplanation:
    workload = request.workload_id
    admission = core._admission(request, gpu_type=gpu_type)
    total = core._pool.type_gpus(gpu_type) if core._typed else core._pool.total_gpus
    # After the quota (the order of `core.pending`): "no lendable capacity" would read as if
    # other teams held the GPUs.
    if request.gpus > total and (admission.allowed or admission.reason == NO_LENDABLE_CAPACITY):
        where = f"{gpu_type} GPUs" if gpu_type else "GPUs"
        return PendingExplanation(
            PendingReason.CAPACITY,
            f"larger than the cluster: needs {request.gpus} GPUs, it has {total} {where}; waits for nodes to be added",
        )
    if admission.reason == NO_LENDABLE_CAPACITY:
        return PendingExplanation(PendingReason.CAPACITY, admission.reason)
    if not admission.allowed:
        return PendingExplanation(PendingReason.QUOTA, admission.reason)
    free = core._pool.type_free(gpu_type) if core._typed else core._pool.free_gpus
    if free < request.gpus:
        return PendingExplanation(PendingReason.CAPACITY, f"needs {request.gpus} GPUs, {free} free")
    if core._find(request, {}, {}, gpu_type) is None:
        shape = "+".join(str(b) for b in request.bundles)
        return PendingExplanation(PendingReason.GANG_FIT, f"{free} GPUs free, not as bundles {shape}")
    waived = core._holds.waived_for(workload, core._value(request))
    if core._find(request, core._holds.per_node, waived, gpu_type) is None:
        holders = len([w for w in core._holds if w != workload])
        return PendingExplanation(PendingReason.RESERVATION, f"free GPUs held for {holders} reserved gang(s)")
    return PendingExplanation(PendingReason.QUEUE_ORDER, "fits now")


@dataclass(frozen=True, slots=True)
class CapacityNeed:
    """A queued gang that more GPUs of `gpu_type` ("" where the policy declares no types)
    would let start: what a driver asks an autoscaler for."""

    request: GangRequest
    gpu_type: str = ""


def waiting_for_capacity(core: Scheduler) -> list[CapacityNeed]:
    """Queued gangs within their quota (or refused only because the cluster has no capacity
    left to lend) and not already waiting for preemption victims to leave, each on the first
    of its GPU types where more nodes would admit it."""
    out = []
    for pending in core._queues.items():
        request = pending.request
        if core._awaiting.get(request.workload_id):
            continue  # its GPUs are on their way: the victims are leaving
        for gpu_type, admission in core._admissions(request):
            if admission.allowed or admission.reason == NO_LENDABLE_CAPACITY:
                out.append(CapacityNeed(request, gpu_type))
                break
        # else: held back by its quota on every type: more nodes would not admit it
    return out
