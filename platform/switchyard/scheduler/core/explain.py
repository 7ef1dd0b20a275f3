"""Why a pending workload waits, and which waiting gangs more capacity would start: read-only
judgements over the scheduler's state (`Scheduler.explain_pending`, `waiting_for_capacity`).

Kept out of `scheduler.py` so that module holds the decisions only; like `cordon`, these read
`Scheduler`'s private state, and mypy checks every name used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from switchyard.scheduler.core.model import GangRequest, PendingWorkload
from switchyard.scheduler.core.pending import PendingExplanation, PendingReason, furthest
from switchyard.scheduler.core.quota import NO_LENDABLE_CAPACITY

if TYPE_CHECKING:
    from switchyard.scheduler.core.scheduler import Scheduler


def explain_pending(core: Scheduler, pending: PendingWorkload) -> PendingExplanation:
    """Why `pending` has not started (see core.pending). A request that may take several GPU
    types gets the reason of the type it came closest on, and a detail naming each type's."""
    request = pending.request
    workload = request.workload_id
    if core._awaiting.get(workload):
        return PendingExplanation(PendingReason.PREEMPTING, f"{len(core._awaiting[workload])} victim(s) leaving")
    if not core._typed:
        return _explain_on(core, request, "")
    per_type = [(t, _explain_on(core, request, t)) for t in core._types(request)]
    best = furthest([why for _, why in per_type])
    detail = "; ".join(f"{t}: {why.reason.value} ({why.detail})" for t, why in per_type)
    return PendingExplanation(best.reason, detail)


def _explain_on(core: Scheduler, request: GangRequest, gpu_type: str) -> PendingExplanation:
    workload = request.workload_id
    admission = core._admission(request, gpu_type=gpu_type)
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
    if core._find(request, core._held, core._waived_for(workload, core._value(request)), gpu_type) is None:
        holders = len([w for w in core._reserved if w != workload])
        return PendingExplanation(PendingReason.RESERVATION, f"free GPUs held for {holders} reserved gang(s)")
    return PendingExplanation(PendingReason.QUEUE_ORDER, "fits now")


def waiting_for_capacity(core: Scheduler) -> list[GangRequest]:
    """Queued gangs within their quota (or refused only because the cluster has no capacity
    left to lend) and not already waiting for preemption victims to leave."""
    out = []
    for pending in core._queues.items():
        request = pending.request
        if core._awaiting.get(request.workload_id):
            continue  # its GPUs are on their way: the victims are leaving
        if all(not a.allowed and a.reason != NO_LENDABLE_CAPACITY for _, a in core._admissions(request)):
            continue  # held back by its quota on every type: more nodes would not admit it
        out.append(request)
    return out
