"""The names shared by the trainer, the job spec and the planner.

One enum per concept, so a job spec, a planner run and a training run can never disagree on
what `fsdp-grad-op` means.
"""

from __future__ import annotations

from enum import StrEnum


class Strategy(StrEnum):
    """How parameters, gradients and optimizer state are spread over the data-parallel ranks."""

    DDP = "ddp"
    FSDP_FULL = "fsdp-full"  # FSDP1 FULL_SHARD; FSDP2 reshard_after_forward=True
    FSDP_GRAD_OP = "fsdp-grad-op"  # FSDP1 SHARD_GRAD_OP; FSDP2 reshard_after_forward=False
    FSDP_NO_SHARD = "fsdp-no-shard"  # FSDP1 NO_SHARD; FSDP2 over a mesh of size 1 per shard group
    FSDP_HYBRID = "fsdp-hybrid"  # FSDP1 HYBRID_SHARD; FSDP2 over a 2-D (replicate, shard) mesh
    ZERO1 = "zero1"
    ZERO2 = "zero2"
    ZERO3 = "zero3"

    @property
    def is_fsdp(self) -> bool:
        return self.value.startswith("fsdp")

    @property
    def is_deepspeed(self) -> bool:
        return self.value.startswith("zero")


class Offload(StrEnum):
    """Where DeepSpeed keeps optimizer state (and, at ZeRO-3, parameters) between uses."""

    NONE = "none"
    CPU = "cpu"
    NVME = "nvme"


class CheckpointMode(StrEnum):
    """Activation checkpointing: which activations are recomputed in backward."""

    NONE = "none"
    FULL = "full"  # every transformer block
    EVERY_K = "every-k"  # every k-th block
    SELECTIVE = "selective"  # Megatron-style: only the attention core
    OP = "op"  # torchtitan's op-level SAC: every block, matmul outputs kept, element-wise ops recomputed


class WrapGranularity(StrEnum):
    """The unit FSDP shards and gathers as one: a transformer block, each linear layer, or the root."""

    BLOCK = "block"
    LAYER = "layer"
    ROOT = "root"
