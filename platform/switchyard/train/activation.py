"""Activation checkpointing modes applied to a `GPT`, before any sharding.

Uses the composable `checkpoint` API, which registers hooks instead of wrapping modules, so
parameter names (and so every checkpoint and `init_from`) are the same in every mode.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed._composable import checkpoint
from torch.utils.checkpoint import (
    CheckpointPolicy,
    SelectiveCheckpointContext,
    create_selective_checkpoint_contexts,
)

from switchyard.models import GPT
from switchyard.train.strategy import CheckpointMode

_aten = torch.ops.aten
SAVED_OPS = frozenset(
    {
        _aten.mm.default,
        _aten.addmm.default,
        _aten.bmm.default,
        _aten._scaled_dot_product_flash_attention.default,
        _aten._scaled_dot_product_flash_attention_for_cpu.default,
        _aten._scaled_dot_product_efficient_attention.default,
        _aten._scaled_dot_product_cudnn_attention.default,
        _aten._scaled_dot_product_fused_attention_overrideable.default,
    }
)
"""What `op` mode keeps: matmuls and attention kernels, the ops with the most FLOPs per
output byte. Everything else (norms, GELU, adds, views) is recomputed from their outputs."""


def _keep_matmuls(ctx: SelectiveCheckpointContext, op: Any, *args: Any, **kwargs: Any) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in SAVED_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def _op_level_contexts() -> Any:
    # A fresh pair per forward: the pair shares the cache the recompute reads from.
    return create_selective_checkpoint_contexts(_keep_matmuls)


def checkpointed_modules(model: GPT, mode: CheckpointMode, every_k: int = 2) -> list[nn.Module]:
    """The submodules whose activations are dropped in forward and recomputed in backward
    (in `op` mode: only their element-wise ones)."""
    blocks = list(model.blocks)
    if mode is CheckpointMode.NONE:
        return []
    if mode in (CheckpointMode.FULL, CheckpointMode.OP):
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
    options = {"context_fn": _op_level_contexts} if mode is CheckpointMode.OP else {}
    for module in modules:
        checkpoint(module, **options)
    return len(modules)
