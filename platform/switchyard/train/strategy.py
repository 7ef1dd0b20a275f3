"""The names shared by the trainer, the job spec and the planner.

One enum per concept, so a job spec, a planner run and a training run can never disagree on
what `fsdp-grad-op` means; and the one rule for fsdp-hybrid's mesh (`hybrid_layout`), so the
trainer and the planner never disagree on how many replicas a job has.
"""

from __future__ import annotations

from enum import StrEnum
from typing import NamedTuple


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


class HybridLayout(NamedTuple):
    """fsdp-hybrid's 2-D mesh: `replicas` copies of the model, each sharded over `shard` ranks."""

    replicas: int
    shard: int


def hybrid_layout(ranks: int, ranks_per_node: int, replicate_degree: int | None = None) -> HybridLayout:
    """The one rule the trainer and the planner share. By default a shard group is one node:
    the per-layer all-gathers and reduce-scatters stay on the node's fast links, and only the
    once-a-step gradient all-reduce crosses nodes. `replicate_degree` sets the replicas instead."""
    if ranks < 1 or ranks_per_node < 1:
        raise ValueError(f"fsdp-hybrid needs at least one rank per node, got {ranks} ranks, {ranks_per_node} per node")
    if replicate_degree is not None:
        if replicate_degree < 1 or ranks % replicate_degree:
            raise ValueError(
                f"parallel.replicate_degree: {ranks} ranks are not a whole number of {replicate_degree} replicas"
            )
        return HybridLayout(replicate_degree, ranks // replicate_degree)
    shard = min(ranks, ranks_per_node)
    if ranks % shard:
        raise ValueError(
            f"fsdp-hybrid: {ranks} ranks do not fill whole nodes of {shard} (one shard group per node); "
            "set parallel.replicate_degree"
        )
    return HybridLayout(ranks // shard, shard)
