"""What the job does on each GPU: strategy, precision, optimizer, batch and recomputation."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from switchyard.train.plan.errors import PlanError
from switchyard.train.strategy import CheckpointMode, Offload, Strategy, WrapGranularity


class Precision(StrEnum):
    """Compute precision. bf16 and fp16 are mixed precision: fp32 master weights and
    optimizer state, 16-bit compute; fp32 is fp32 throughout."""

    BF16 = "bf16"
    FP16 = "fp16"
    FP32 = "fp32"

    @property
    def compute_bytes(self) -> int:
        return 4 if self is Precision.FP32 else 2


class OptimizerKind(StrEnum):
    ADAM = "adam"
    ADAMW = "adamw"
    SGD = "sgd"  # with momentum: one fp32 buffer per parameter

    @property
    def state_bytes(self) -> int:
        """fp32 optimizer state per parameter, not counting a master copy of the weights."""
        return 4 if self is OptimizerKind.SGD else 8  # momentum; Adam's exp_avg + exp_avg_sq


@dataclass(frozen=True)
class TrainingJob:
    strategy: Strategy = Strategy.ZERO3
    precision: Precision = Precision.BF16
    optimizer: OptimizerKind = OptimizerKind.ADAMW
    offload: Offload = Offload.NONE
    micro_batch: int = 1
    """Sequences per GPU per forward pass (b)."""
    seq_len: int = 4096
    """Tokens per sequence (s)."""
    grad_accum: int = 1
    """Micro-batches per optimizer step."""
    checkpointing: CheckpointMode = CheckpointMode.NONE
    checkpoint_every_k: int = 2
    """For `every-k`: blocks 0, k, 2k, ... are recomputed (as the trainer does)."""
    flash_attention: bool = True
    """Attention never materialises the axsxs score matrix (SDPA flash / memory-efficient)."""
    wrap: WrapGranularity = WrapGranularity.BLOCK
    prefetch: int = 1
    """FSDP/ZeRO-3 units gathered ahead of the one computing (FSDP2's default is 1)."""
    shard_group: int | None = None
    """fsdp-hybrid: GPUs per shard group (default: one node)."""

    def __post_init__(self) -> None:
        for name in ("micro_batch", "seq_len", "grad_accum", "checkpoint_every_k"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise PlanError(f"job.{name} must be a positive integer, got {value!r}")
        if self.prefetch < 0:
            raise PlanError(f"job.prefetch must be >= 0, got {self.prefetch!r}")
        if self.shard_group is not None and self.shard_group < 1:
            raise PlanError(f"job.shard_group must be >= 1, got {self.shard_group!r}")
        if self.offload is not Offload.NONE and self.strategy is Strategy.DDP:
            raise PlanError("job.offload: strategy 'ddp' cannot offload; use fsdp-* or zero*")
        if self.offload is Offload.NVME and self.strategy.is_fsdp:
            raise PlanError(f"job.offload: 'nvme' needs a zero* strategy, not {self.strategy}")

    @property
    def tokens_per_micro_batch(self) -> int:
        return self.micro_batch * self.seq_len
