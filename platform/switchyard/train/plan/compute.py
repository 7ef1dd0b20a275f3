"""Compute time per step: model FLOPs (PaLM's 6Ψ + 12·L·h·s per token, Chowdhery et al.
2022, appendix B) plus the forward work that activation recomputation repeats, at the
cluster's peak * MFU."""

from __future__ import annotations

from switchyard.train.plan.activations import checkpointed_blocks
from switchyard.train.plan.hardware import ClusterSpec
from switchyard.train.plan.job import Precision, TrainingJob
from switchyard.train.plan.shape import ModelShape
from switchyard.train.plan.terms import Term, count
from switchyard.train.strategy import CheckpointMode


def step_flops(shape: ModelShape, job: TrainingJob) -> Term:
    """FLOPs per GPU per optimizer step, recomputation included."""
    tokens = job.tokens_per_micro_batch * job.grad_accum
    psi, L, h, s = shape.matmul_params(), shape.layers, shape.hidden, job.seq_len
    model = 6 * psi + 12 * L * h * s
    block_fwd = 2 * shape.block_params() + 4 * h * s  # one block's forward, per token
    mode = job.checkpointing
    if mode is CheckpointMode.SELECTIVE:
        extra, why = 4 * L * h * s, " + 4·L·h·s (attention core recomputed)"
    else:
        n = checkpointed_blocks(L, mode, job.checkpoint_every_k)
        extra, why = n * block_fwd, (f" + {n} recomputed block forwards" if n else "")
    return Term(
        tokens * (model + extra),
        f"tokens·(6·Ψ_matmul + 12·L·h·s{why}) = {count(tokens)}·(6·{count(psi)} + "
        f"12·{L}·{h}·{s}{' + ' + count(extra) if extra else ''})",
    )


def compute_seconds(flops: Term, cluster: ClusterSpec, precision: Precision) -> Term:
    peak = cluster.fp32_peak_tflops if precision is Precision.FP32 else cluster.peak_tflops
    seconds = flops.value / (peak * 1e12 * cluster.mfu)
    return Term(seconds, f"FLOPs / (peak·MFU) = {flops.value:.3g} / ({peak:g}e12·{cluster.mfu:g})")
