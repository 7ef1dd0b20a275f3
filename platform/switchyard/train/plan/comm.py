"""Communication per GPU per step, with ring collective costs.

For a buffer of M bytes over n ranks, a ring moves per rank: all-reduce 2·(n-1)/n·M,
all-gather (n-1)/n·M, reduce-scatter (n-1)/n·M (Patarasuk and Yuan 2009; NCCL's bus
bandwidth is defined so that time = these bytes / bus bandwidth). Each collective launch
also pays one ring step's latency per step of the ring: (n-1) for a gather or a
reduce-scatter, 2·(n-1) for an all-reduce.

Which collectives run, per step of m micro-batches, as the trainer configures them:
- ddp, fsdp-no-shard: one all-reduce of the fp32 gradients per step: the trainer skips
  the reduction on all but the last micro-batch (DDP `no_sync`, FSDP
  `set_requires_gradient_sync(False)`); their gradients are whole anyway.
- zero1: reduce-scatter the fp32 gradients and all-gather the updated 16-bit parameters, once
  a step. DeepSpeed issues the reduce-scatter as one `reduce` per owning rank
  (`use_multi_rank_bucket_allreduce: false`): the same bytes per rank. Its default, a bucket
  all-reduce, would send twice the gradient bytes.
- zero2: as zero1, but gradients are reduce-scattered every micro-batch.
- fsdp-full: every micro-batch, all-gather all parameters in forward and again in backward
  all but the root (FSDP2 never reshards it after forward) and the last unit (the trainer
  keeps it: backward needs it first); reduce-scatter the fp32 gradients. For many units that
  is (2·2 + 4)Ψ against zero1's (4 + 2)Ψ: 4/3, or 1.5 with 16-bit gradient reduction, the
  ZeRO paper's setting (Rajbhandari et al. 2020, section 7).
- zero3: as DeepSpeed gathers (`switchyard.train.plan.zero3`): non-persistent parameters in
  forward and, unless reused soon enough, again in backward, every micro-batch; persistent
  ones (at most 1e5 elements) once per step; the same reduce-scatter as fsdp-full.
- fsdp-grad-op: one all-gather (parameters stay gathered into backward) + reduce-scatter.
- fsdp-hybrid: fsdp-full inside a shard group of G ranks, plus an all-reduce of each
  rank's 1/G gradient shard across the N/G groups once per step: the trainer reduce-scatters
  every micro-batch (gradients stay sharded) and skips only the cross-replica all-reduce
  until the last one (`set_requires_all_reduce(False)`).
Every strategy reduces gradients in fp32 (FSDP `reduce_dtype`, DDP's fp32 gradients,
DeepSpeed `communication_data_type: fp32`) and gathers parameters in the compute dtype.

Exposed communication is what no computation can hide: the first parameter gather of each
micro-batch (nothing computes before it), the last gradient reduction of each reduction pass
(nothing computes after it) and, for ZeRO, the parameter gathers after the optimizer step.
With only Ψ known the units are not, and FSDP/ZeRO-3 are costed in the many-unit limit
(2Ψ gathered per micro-batch) with one launch per pass and nothing exposed but ZeRO's
post-step gathers.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from switchyard.train.plan.hardware import GB, ClusterSpec
from switchyard.train.plan.job import Precision, TrainingJob
from switchyard.train.plan.shape import ModelShape
from switchyard.train.plan.states import gradient_bytes
from switchyard.train.plan.terms import Term, count
from switchyard.train.plan.zero3 import zero3_gathers
from switchyard.train.strategy import Offload, Strategy, WrapGranularity

DDP_BUCKET_BYTES = 25 * 1024**2
"""DDP's `bucket_cap_mb` default: gradients are all-reduced in buckets of 25 MiB."""
ZERO_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's `reduce_bucket_size`, which the trainer caps at Ψ."""


class Collective(StrEnum):
    ALL_REDUCE = "all-reduce"
    ALL_GATHER = "all-gather"
    REDUCE_SCATTER = "reduce-scatter"

    def ring_factor(self, ranks: int) -> float:
        """Bytes each rank sends per byte of the full buffer."""
        share = (ranks - 1) / ranks
        return 2 * share if self is Collective.ALL_REDUCE else share

    def ring_steps(self, ranks: int) -> int:
        """Steps of the ring, each paying one hop's latency."""
        return (2 if self is Collective.ALL_REDUCE else 1) * (ranks - 1)


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
    calls: int = 0
    """Collective launches per step (units, buckets or owners), each paying the ring's latency."""
    hop_seconds: float = 0.0
    exposed_buffer_bytes: float = 0.0
    """Full-buffer bytes per step that no computation hides."""
    exposed_calls: int = 0

    @property
    def bytes_per_gpu(self) -> float:
        return self.per_step * self.collective.ring_factor(self.ranks) * self.buffer_bytes

    def _time(self, buffer_bytes: float, calls: int) -> float:
        bandwidth = self.collective.ring_factor(self.ranks) * buffer_bytes / (self.gbps * GB)
        return bandwidth + calls * self.collective.ring_steps(self.ranks) * self.hop_seconds

    @property
    def latency_seconds(self) -> float:
        return self.calls * self.collective.ring_steps(self.ranks) * self.hop_seconds

    @property
    def seconds(self) -> float:
        return self._time(self.per_step * self.buffer_bytes, self.calls)

    @property
    def exposed_seconds(self) -> float:
        return self._time(self.exposed_buffer_bytes, self.exposed_calls)

    @property
    def formula(self) -> str:
        factor = "2·(n-1)/n" if self.collective is Collective.ALL_REDUCE else "(n-1)/n"
        return (
            f"{self.purpose}: {self.per_step}x {self.collective} {factor}·M, n={self.ranks}, "
            f"M={count(self.buffer_bytes)} B at {self.gbps:g} GB/s, {self.calls} launches"
        )


@dataclass(frozen=True)
class Gathers:
    """Parameter elements all-gathered in a step, and what of that is exposed."""

    per_micro_batch: float
    calls_per_micro_batch: int
    first: float
    """Elements of each micro-batch's first gather, which nothing overlaps."""
    last_reduced: float
    """Elements of each reduction pass's last gradient reduction (the root unit's, or a bucket)."""
    reduce_calls: int
    """Reduce-scatter launches per micro-batch."""
    persistent: float = 0.0
    """ZeRO-3: elements gathered once per step after the optimizer step."""


def sharded_gathers(shape: ModelShape | None, params: int, job: TrainingJob) -> Gathers:
    """What FSDP (full, grad-op, hybrid) or ZeRO-3 gathers and reduces per micro-batch."""
    bucket = min(params, ZERO_BUCKET_ELEMENTS)
    if shape is None:
        passes = 1 if job.strategy is Strategy.FSDP_GRAD_OP else 2
        return Gathers(passes * params, passes, 0.0, 0.0, 1)
    if job.strategy is Strategy.ZERO3:
        z = zero3_gathers(shape)
        buckets = -(-params // bucket)
        return Gathers(z.per_micro_batch, z.calls_per_micro_batch, z.first_module, bucket, buckets, z.persistent)
    units = shape.fsdp_unit_count(job.wrap)
    root = shape.fsdp_root_params(job.wrap)
    if job.strategy is Strategy.FSDP_GRAD_OP:
        return Gathers(params, units, root, root, units)
    backward = shape.fsdp_backward_gather(job.wrap)
    regathered_units = 0 if job.wrap is WrapGranularity.ROOT else units - 2
    return Gathers(params + backward, units + regathered_units, root, root, units)


def transfers(
    params: int, cluster: ClusterSpec, job: TrainingJob, group: int, shape: ModelShape | None = None
) -> list[Transfer]:
    n, m, strategy = cluster.gpus, job.grad_accum, job.strategy
    if n == 1:
        return []
    e = job.precision.compute_bytes
    bw, hop = cluster.ring_gbps(n), cluster.ring_step_seconds(n)
    if strategy in (Strategy.DDP, Strategy.FSDP_NO_SHARD):
        return [_replicated_reduction(params, shape, job, n, bw, hop)]
    if strategy in (Strategy.ZERO1, Strategy.ZERO2):
        reductions = 1 if strategy is Strategy.ZERO1 else m
        bucket = min(params, ZERO_BUCKET_ELEMENTS)
        owner_calls = -(-params // bucket) * n  # one `reduce` per owner per bucket
        return [
            Transfer(
                "gradients", Collective.REDUCE_SCATTER, 4.0 * params, n, reductions, bw,
                reductions * owner_calls, hop, reductions * 4.0 * bucket, reductions * n,
            ),
            Transfer(
                "updated parameters", Collective.ALL_GATHER, e * params, n, 1, bw, 1, hop, e * params, 1
            ),
        ]
    return _sharded_transfers(params, cluster, job, group, sharded_gathers(shape, params, job))


def _replicated_reduction(
    params: int, shape: ModelShape | None, job: TrainingJob, n: int, bw: float, hop: float
) -> Transfer:
    """DDP's bucketed all-reduce, or NO_SHARD's one all-reduce per FSDP unit, once a step."""
    grads = 4.0 * params
    if job.strategy is Strategy.DDP:
        calls, last = -(-int(grads) // DDP_BUCKET_BYTES), min(grads, DDP_BUCKET_BYTES)
    elif shape is None:
        calls, last = 1, 0.0
    else:
        calls, last = shape.fsdp_unit_count(job.wrap), 4.0 * shape.fsdp_root_params(job.wrap)
    return Transfer("gradients", Collective.ALL_REDUCE, grads, n, 1, bw, calls, hop, last, 1 if last else 0)


def _sharded_transfers(params: int, cluster: ClusterSpec, job: TrainingJob, group: int, g: Gathers) -> list[Transfer]:
    n, m, e = cluster.gpus, job.grad_accum, job.precision.compute_bytes
    bw, hop = cluster.ring_gbps(group), cluster.ring_step_seconds(group)
    first_calls = m if g.first else 0
    last_calls = m if g.last_reduced else 0
    out = [
        Transfer(
            "parameters (fwd+bwd)" if g.per_micro_batch > params else "parameters (fwd)",
            Collective.ALL_GATHER, e * g.per_micro_batch, group, m, bw,
            m * g.calls_per_micro_batch, hop, m * e * g.first, first_calls,
        ),
        Transfer(
            "gradients", Collective.REDUCE_SCATTER, 4.0 * params, group, m, bw,
            m * g.reduce_calls, hop, m * 4.0 * g.last_reduced, last_calls,
        ),
    ]
    if g.persistent:
        out.append(
            Transfer(
                "persistent parameters after the step", Collective.ALL_GATHER, e * g.persistent, group, 1, bw,
                1, hop, e * g.persistent, 1,
            )
        )
    if job.strategy is Strategy.FSDP_HYBRID and n > group:
        replicas = n // group
        cross_bw = cluster.network_gbps_per_gpu if n > cluster.gpus_per_node else cluster.ring_gbps(n)
        cross_hop = cluster.ring_step_seconds(n)
        shard = 4.0 * params / group
        out.append(
            Transfer(
                "gradient shards across groups", Collective.ALL_REDUCE, shard, replicas, 1, cross_bw,
                g.reduce_calls, cross_hop, 4.0 * g.last_reduced / group, 1 if g.last_reduced else 0,
            )
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
        """Bandwidth and latency of every transfer, as if none overlapped computation."""
        return sum(t.seconds for t in self.transfers)

    @property
    def latency_seconds(self) -> float:
        return sum(t.latency_seconds for t in self.transfers)

    @property
    def exposed_seconds(self) -> float:
        """The part no computation hides (module docstring)."""
        return sum(t.exposed_seconds for t in self.transfers)

    @property
    def offload_seconds(self) -> float:
        return self.offload.value / (self.pcie_gbps * GB)

    def formula(self) -> str:
        return " + ".join(t.formula for t in self.transfers) or "single GPU: no collectives"


def communication(
    params: int, cluster: ClusterSpec, job: TrainingJob, group: int, shape: ModelShape | None = None
) -> Communication:
    return Communication(
        transfers(params, cluster, job, group, shape),
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
