"""Activation checkpointing modes applied to a `GPT`, before any sharding.

Uses the composable `checkpoint` API, which registers hooks instead of wrapping modules, so
parameter names (and so every checkpoint and `init_from`) are the same in every mode.
"""

from __future__ import annotations

from torch import nn
from torch.distributed._composable import checkpoint

from switchyard.models import GPT
from switchyard.train.strategy import CheckpointMode


def checkpointed_modules(model: GPT, mode: CheckpointMode, every_k: int = 2) -> list[nn.Module]:
    """The submodules whose activations are dropped in forward and recomputed in backward."""
    blocks = list(model.blocks)
    if mode is CheckpointMode.NONE:
        return []
    if mode is CheckpointMode.FULL:
        return blocks
    if mode is CheckpointMode.EVERY_K:
        if every_k < 1:
            raise ValueError(f"every-k checkpointing needs k >= 1, got {every_k}")
        return blocks[::every_k]
    # Selective (Megatron): only softmax(QK^T)V, whose activations are O(T^2) per head but
    # whose recompute costs no parameter gathers and few FLOPs next to the matmuls.
    return [block.attn.core for block in blocks]  # type: ignore[union-attr]


def apply_activation_checkpointing(model: GPT, mode: CheckpointMode, every_k: int = 2) -> int:
    """Apply `mode` in place; returns how many modules are recomputed."""
    modules = checkpointed_modules(model, mode, every_k)
    for module in modules:
        checkpoint(module)
    return len(modules)
