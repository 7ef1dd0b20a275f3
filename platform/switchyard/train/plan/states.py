"""Model states per GPU: parameters, gradients and optimizer state, sharded per strategy.

DeepSpeed (zero1/2/3) in mixed precision keeps 16-bit parameters (2Ψ) and K=12 bytes of
optimizer state per parameter (fp32 master weights, Adam's momentum and variance), as in the
ZeRO paper (Rajbhandari et al. 2020, section 3.1). Its gradients are what the trainer's
config makes them: at stage 1 16-bit (2Ψ), at stages 2 and 3 fp32 partitions (4Ψ/N), since
the trainer accumulates and reduces them in fp32 where the paper has 16-bit ones (2Ψ/N).
Stage 1 shards the optimizer state, stage 2 also the gradients, stage 3 also the parameters.

PyTorch (ddp, fsdp-*) keeps fp32 parameters, which double as the master weights, and fp32
gradients (the trainer reduces in fp32); its 16-bit copies are transient (see transient.py).
With Adam that is 16 bytes per parameter for PyTorch and ZeRO-1, 18 for ZeRO-2 and ZeRO-3.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.job import OptimizerKind, Precision
from switchyard.train.plan.terms import Term, count
from switchyard.train.strategy import Offload, Strategy


@dataclass(frozen=True)
class ShardDegrees:
    """How many ranks share one copy of each state (1 = replicated)."""

    parameters: int
    gradients: int
    optimizer: int


def shard_group_size(strategy: Strategy, gpus: int, gpus_per_node: int, shard_group: int | None) -> int:
    """Ranks a sharded state is spread over: all of them, or one shard group for fsdp-hybrid."""
    if strategy is not Strategy.FSDP_HYBRID:
        return gpus
    group = shard_group or min(gpus, gpus_per_node)
    if gpus % group:
        raise PlanError(f"job.shard_group: {gpus} GPUs are not a multiple of shard groups of {group}")
    return group


def shard_degrees(strategy: Strategy, group: int) -> ShardDegrees:
    if strategy in (Strategy.DDP, Strategy.FSDP_NO_SHARD):
        return ShardDegrees(1, 1, 1)
    if strategy is Strategy.ZERO1:
        return ShardDegrees(1, 1, group)
    if strategy is Strategy.ZERO2:
        return ShardDegrees(1, group, group)
    return ShardDegrees(group, group, group)  # zero3, fsdp-full, fsdp-grad-op, fsdp-hybrid


@dataclass(frozen=True)
class BytesPerParam:
    parameters: int
    gradients: int
    optimizer: int

    @classmethod
    def of(cls, strategy: Strategy, precision: Precision, optimizer: OptimizerKind) -> BytesPerParam:
        if strategy.is_deepspeed and precision is not Precision.FP32:
            # 16-bit params; fp32 master copy (4) inside the optimizer.
            return cls(2, gradient_bytes(strategy, precision), 4 + optimizer.state_bytes)
        return cls(4, 4, optimizer.state_bytes)


def gradient_bytes(strategy: Strategy, precision: Precision) -> int:
    """Bytes per gradient element as the trainer keeps them between micro-batches: fp32,
    except DeepSpeed ZeRO-1 in mixed precision, which accumulates its whole 16-bit gradients
    (DeepSpeed runs bf16 ZeRO-1 with fp32 accumulation through its BF16_Optimizer instead,
    which all-reduces whole fp32 gradients)."""
    if strategy is Strategy.ZERO1 and precision is not Precision.FP32:
        return precision.compute_bytes
    return 4


def offloaded(strategy: Strategy, offload: Offload, precision: Precision) -> ShardDegrees:
    """1 where a state lives on the host instead of the GPU (a ShardDegrees used as flags)."""
    if offload is Offload.NONE:
        return ShardDegrees(0, 0, 0)
    if strategy is Strategy.ZERO1:
        return ShardDegrees(0, 0, 1)  # offload_optimizer: state and fp32 master on the host
    if strategy is Strategy.ZERO2:
        # Reduced gradient partitions go to the host for the step. In mixed precision DeepSpeed
        # accumulates them in fp32 on the GPU first and copies them once a step (gpu_and_host).
        return ShardDegrees(0, int(precision is Precision.FP32), 1)
    return ShardDegrees(1, 1, 1)  # zero3 offload_param + offload_optimizer; FSDP CPUOffloadPolicy


def gpu_and_host(strategy: Strategy, offload: Offload, precision: Precision) -> bool:
    """ZeRO-2 offload in mixed precision holds its fp32 gradient partition on the GPU and a
    copy of it on the host."""
    return strategy is Strategy.ZERO2 and offload is not Offload.NONE and precision is not Precision.FP32


@dataclass(frozen=True)
class ModelStates:
    parameters: Term
    gradients: Term
    optimizer: Term
    host: Term
    """Bytes per GPU that offload moved to host memory (or NVMe)."""

    @property
    def total(self) -> Term:
        parts = (self.parameters, self.gradients, self.optimizer)
        return Term(sum(p.value for p in parts), "parameters + gradients + optimizer")


def model_states(
    params: int,
    strategy: Strategy,
    precision: Precision,
    optimizer: OptimizerKind,
    offload: Offload,
    group: int,
) -> ModelStates:
    per = BytesPerParam.of(strategy, precision, optimizer)
    shards = shard_degrees(strategy, group)
    host = offloaded(strategy, offload, precision)
    terms: list[Term] = []
    host_bytes = 0.0
    for name, k, d, off in (
        ("params", per.parameters, shards.parameters, host.parameters),
        ("grads", per.gradients, shards.gradients, host.gradients),
        ("optimizer", per.optimizer, shards.optimizer, host.optimizer),
    ):
        value = k * params / d
        divisor = "G" if strategy is Strategy.FSDP_HYBRID else "N"
        symbolic = f"{k}·Ψ" + (f"/{divisor}" if d > 1 else "")
        numbers = f"{k}·{count(params)}" + (f"/{d}" if d > 1 else "")
        if off:
            host_bytes += value
            terms.append(Term(0.0, f"0 on GPU: {name} offloaded ({symbolic} on host)"))
        else:
            terms.append(Term(value, f"{symbolic} = {numbers}"))
    parameters, gradients, optimizer_state = terms
    if gpu_and_host(strategy, offload, precision):
        host_bytes += gradients.value
    return ModelStates(parameters, gradients, optimizer_state, Term(host_bytes, "offloaded states"))
