"""Transient buffers per GPU: unsharded units in flight, 16-bit copies and reduction buckets.

These are the bytes that exist only during part of a step but sit on top of the model states
at the peak (the end of forward / start of backward).
"""

from __future__ import annotations

from switchyard.train.plan.job import Precision
from switchyard.train.plan.shape import Units
from switchyard.train.plan.terms import Term, count
from switchyard.train.strategy import Offload, Strategy

DEEPSPEED_REDUCE_BUCKET = 500_000_000
"""DeepSpeed's default `reduce_bucket_size` (elements); the trainer caps it at Ψ."""
DEEPSPEED_REDUCE_BUCKETS = 2
"""ZeRO-1/2 buckets in 16-bit gradients: `overlap_comm` reduces one while backward fills the other."""


def transient(
    strategy: Strategy,
    precision: Precision,
    offload: Offload,
    params: int,
    units: Units | None,
    group: int,
    prefetch: int,
) -> Term | None:
    """Peak transient bytes; None when it needs the units and only Ψ is known."""
    e = precision.compute_bytes
    mixed = precision is not Precision.FP32
    if strategy is Strategy.DDP:
        return _ddp(params, e, mixed)
    if strategy in (Strategy.ZERO1, Strategy.ZERO2):
        return _zero12(strategy, params, e, mixed, offload, group)
    if units is None:
        return None
    unit = units.largest
    # Gradients are reduced in fp32 (FSDP's reduce_dtype, DeepSpeed's communication_data_type),
    # so a 16-bit unsharded gradient is upcast before its reduce-scatter.
    grad_b = e + 4 if mixed else 4
    grads = Term(unit * grad_b, f"U·{grad_b} = {count(unit)}·{grad_b}")
    if strategy is Strategy.FSDP_GRAD_OP:
        held = Term(params * e, f"Ψ·{e} = {count(params)}·{e} (all units kept from forward)")
    else:
        ahead = prefetch * units.prefetched
        held = Term(
            (unit + ahead) * e,
            f"(U + {prefetch}·U_p)·{e} = ({count(unit)} + {prefetch}·{count(units.prefetched)})·{e}",
        )
    return Term(
        held.value + grads.value,
        f"gathered params {held.formula} + unsharded grads {grads.formula}",
    )


def _ddp(params: int, e: int, mixed: bool) -> Term:
    # DDP's reducer keeps flat buckets as large as all gradients unless
    # gradient_as_bucket_view=True (the default is False).
    buckets = params * 4
    if not mixed:
        return Term(buckets, f"reducer buckets Ψ·4 = {count(params)}·4")
    # autocast caches the 16-bit cast of every weight until forward ends.
    return Term(
        buckets + params * e,
        f"reducer buckets Ψ·4 + autocast weight cache Ψ·{e} = {count(params)}·{4 + e}",
    )


def _zero12(strategy: Strategy, params: int, e: int, mixed: bool, offload: Offload, group: int) -> Term:
    bucket = min(params, DEEPSPEED_REDUCE_BUCKET)
    k = DEEPSPEED_REDUCE_BUCKETS
    buckets_b = k * bucket * e
    # At the optimizer step ZeRO-1 upcasts this rank's 16-bit gradient partition to fp32;
    # ZeRO-2 accumulates it in fp32 (a model state), so there is nothing to upcast.
    upcast = strategy is Strategy.ZERO1 and mixed and offload is Offload.NONE
    step_b = 4 * params / group if upcast else 0.0
    if step_b > buckets_b:
        return Term(step_b, f"fp32 gradient partition at step 4·Ψ/N = 4·{count(params)}/{group}")
    return Term(buckets_b, f"reduce buckets {k}·min(Ψ, 5e8)·{e} = {k}·{count(bucket)}·{e}")
