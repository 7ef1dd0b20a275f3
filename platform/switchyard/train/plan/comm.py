"""Communication per GPU per step, with ring collective costs.

For a buffer of M bytes over n ranks, a ring moves per rank: all-reduce 2·(n-1)/n·M,
all-gather (n-1)/n·M, reduce-scatter (n-1)/n·M (Patarasuk and Yuan 2009; NCCL's bus
bandwidth is defined so that time = these bytes / bus bandwidth). Latency terms are ignored:
at these sizes bandwidth dominates.

Which collectives run, per step of m micro-batches, as the trainer configures them:
- ddp, fsdp-no-shard: one all-reduce of the fp32 gradients per step: the trainer skips
  the reduction on all but the last micro-batch (DDP `no_sync`, FSDP
  `set_requires_gradient_sync(False)`); their gradients are whole anyway.
- zero1: reduce-scatter the fp32 gradients and all-gather the updated 16-bit parameters, once
  a step. DeepSpeed issues the reduce-scatter as one `reduce` per owning rank
  (`use_multi_rank_bucket_allreduce: false`): the same bytes per rank. Its default, a bucket
  all-reduce, would send twice the gradient bytes.
- zero2: as zero1, but gradients are reduce-scattered every micro-batch.
- zero3, fsdp-full: all-gather the 16-bit parameters in forward and again in backward, and
  reduce-scatter the fp32 gradients, every micro-batch: (2·2 + 4)Ψ against zero1's
  (4 + 2)Ψ, so ZeRO-3 costs 4/3 of ZeRO-1. With 16-bit gradient reduction, the ZeRO paper's
  setting, it is 3Ψ against 2Ψ: 1.5x (Rajbhandari et al. 2020, section 7).
- fsdp-grad-op: one all-gather (parameters stay gathered into backward) + reduce-scatter.
- fsdp-hybrid: fsdp-full inside a shard group of G ranks, plus an all-reduce of each
  rank's 1/G gradient shard across the N/G groups once per step: the trainer reduce-scatters
  every micro-batch (gradients stay sharded) and skips only the cross-replica all-reduce
  until the last one (`set_requires_all_reduce(False)`).
Every strategy reduces gradients in fp32 (FSDP `reduce_dtype`, DDP's fp32 gradients,
DeepSpeed `communication_data_type: fp32`) and gathers parameters in the compute dtype.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from switchyard.train.plan.hardware import GB, ClusterSpec
from switchyard.train.plan.job import Precision, TrainingJob
from switchyard.train.plan.states import gradient_bytes
from switchyard.train.plan.terms import Term, count
from switchyard.train.strategy import Offload, Strategy


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"

    def ring_factor(self, ranks: int) -> float:
        """Bytes each rank sends per byte of the full buffer."""
        share = (ranks - 1) / ranks
        return 2 * share if self is Collective.ALL_REDUCE else share


@dataclass(frozen=True)
class Transfer:
    """One kind of collective in a step: what it moves, over whom, how often."""

    purpose: str
    collective: Collective
    buffer_bytes: float
    """Full (unsharded) size M of the buffer."""
    ranks: int
    per_step: int
    gbps: float

    @property
    def bytes_per_gpu(self) -> float:
        return self.per_step * self.collective.ring_factor(self.ranks) * self.buffer_bytes

    @property
    def seconds(self) -> float:
        return self.bytes_per_gpu / (self.gbps * GB)

    @property
    def formula(self) -> str:
        factor = "2·(n-1)/n" if self.collective is Collective.ALL_REDUCE else "(n-1)/n"
        return (
            f"{self.purpose}: {self.per_step}x {self.collective} {factor}·M, n={self.ranks}, "
            f"M={count(self.buffer_bytes)} B at {self.gbps:g} GB/s"
        )


def transfers(params: int, cluster: ClusterSpec, job: TrainingJob, group: int) -> list[Transfer]:
    n, m, strategy = cluster.gpus, job.grad_accum, job.strategy
    e = job.precision.compute_bytes
    fp32_grads = params * 4.0  # every strategy reduces gradients in fp32
    weights = params * float(e)  # parameters are gathered in the compute dtype
    bw = cluster.ring_gbps(n)
    if n == 1:
        return []
    if strategy is Strategy.DDP:
        return [Transfer("gradients", Collective.ALL_REDUCE, fp32_grads, n, 1, bw)]
    if strategy is Strategy.FSDP_NO_SHARD:
        return [Transfer("gradients", Collective.ALL_REDUCE, fp32_grads, n, 1, bw)]
    if strategy in (Strategy.ZERO1, Strategy.ZERO2):
        reduce_steps = 1 if strategy is Strategy.ZERO1 else m
        return [
            Transfer("gradients", Collective.REDUCE_SCATTER, fp32_grads, n, reduce_steps, bw),
            Transfer("updated parameters", Collective.ALL_GATHER, weights, n, 1, bw),
        ]
    gathers = 1 if strategy is Strategy.FSDP_GRAD_OP else 2
    shard_bw = cluster.ring_gbps(group)
    out = [
        Transfer(
            "parameters (fwd+bwd)" if gathers == 2 else "parameters (fwd)",
            Collective.ALL_GATHER,
            weights,
            group,
            gathers * m,
            shard_bw,
        ),
        Transfer("gradients", Collective.REDUCE_SCATTER, fp32_grads, group, m, shard_bw),
    ]
    if strategy is Strategy.FSDP_HYBRID and n > group:
        replicas = n // group
        cross_bw = cluster.inter_node_gbps if n > cluster.gpus_per_node else bw
        out.append(
            Transfer("gradient shards across groups", Collective.ALL_REDUCE, fp32_grads / group, replicas, 1, cross_bw)
        )
    return out


def offload_traffic(params: int, cluster: ClusterSpec, job: TrainingJob, group: int) -> Term:
    """Host-device bytes per GPU per step that offload adds (over PCIe, not overlapped)."""
    if job.offload is Offload.NONE:
        return Term(0.0, "no offload")
    e, m = job.precision.compute_bytes, job.grad_accum
    shard = params / group
    g_b = gradient_bytes(job.strategy, job.precision)
    if job.strategy in (Strategy.ZERO1, Strategy.ZERO2):
        value = (g_b + e) * shard
        return Term(
            value,
            f"gradient partition down + parameter partition up ({g_b} + {e})·Ψ/N = {g_b + e}·{count(params)}/{group}",
        )
    gathers = 1 if job.strategy is Strategy.FSDP_GRAD_OP else 2
    p_b = e if job.strategy.is_deepspeed else 4
    value = m * (gathers * p_b + g_b) * shard
    return Term(
        value,
        f"m·({gathers}·{p_b} parameter shard up + {g_b} gradient shard down)·Ψ/N"
        f" = {m}·{gathers * p_b + g_b}·{count(params)}/{group}",
    )


@dataclass(frozen=True)
class Communication:
    transfers: list[Transfer]
    offload: Term
    pcie_gbps: float

    @property
    def bytes_per_gpu(self) -> float:
        return sum(t.bytes_per_gpu for t in self.transfers)

    @property
    def seconds(self) -> float:
        return sum(t.seconds for t in self.transfers)

    @property
    def offload_seconds(self) -> float:
        return self.offload.value / (self.pcie_gbps * GB)

    def formula(self) -> str:
        return " + ".join(t.formula for t in self.transfers) or "single GPU: no collectives"


def communication(params: int, cluster: ClusterSpec, job: TrainingJob, group: int) -> Communication:
    return Communication(
        transfers(params, cluster, job, group),
        offload_traffic(params, cluster, job, group),
        cluster.pcie_gbps,
    )


def zero3_over_zero1(params: int, cluster: ClusterSpec, precision: Precision) -> float:
    """ZeRO-3's communication volume as a multiple of ZeRO-1's for the same job: 4/3 in mixed
    precision (16-bit gathers, fp32 reductions), 1.5 in fp32 (every transfer the same size)."""
    vols = []
    for strategy in (Strategy.ZERO3, Strategy.ZERO1):
        job = TrainingJob(strategy=strategy, precision=precision)
        vols.append(sum(t.bytes_per_gpu for t in transfers(params, cluster, job, cluster.gpus)))
    return vols[0] / vols[1]
