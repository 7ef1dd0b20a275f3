"""Measure the activation memory of a forward and backward: the bytes of tensors kept for
backward, counted as unique storages (views and aliases count once), at their peak.

Two instruments, because activation checkpointing hides its tensors from one of them:
- `saved_tensors_hooks` see every tensor autograd saves outside a checkpointed region;
  inside one, the checkpoint's own hooks replace them (and keep the region's inputs in a
  closure, its recomputed tensors in its frame, op-level SAC's outputs in its cache);
- a dispatch mode registers every storage that forward or recomputation (grad mode on)
  produces and follows its lifetime through a weak reference: whatever is still alive is
  held for backward, by autograd or by a checkpoint. It samples after every operator, so the
  peak includes the moment a checkpointed block recomputes in backward.
The test checks the two agree where both see everything (no checkpointing): the storages
alive at the end of forward are exactly those autograd saved, plus the loss.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from switchyard.models import GPT, GPTConfig, next_token_loss
from switchyard.train.activation import apply_activation_checkpointing
from switchyard.train.strategy import CheckpointMode

FLASH_KERNEL = "aten._scaled_dot_product_flash_attention_for_cpu.default"


def _storage_key(t: torch.Tensor) -> int:
    return int(t.untyped_storage().data_ptr())


class LiveActivations(TorchDispatchMode):
    """Storages produced with grad mode on, alive until their last reference goes."""

    def __init__(self, excluded: set[int]) -> None:
        super().__init__()
        self.excluded = excluded
        """Storages that exist before forward (parameters): never activations."""
        self.live: dict[int, tuple[StorageWeakRef, int]] = {}
        self.peak = 0
        self.kernels: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.kernels.add(str(func))
        if torch.is_grad_enabled():
            for t in tree_leaves(out):
                if isinstance(t, torch.Tensor) and _storage_key(t) not in self.excluded:
                    self._register(t)
        self.peak = max(self.peak, self.alive())
        return out

    def _register(self, t: torch.Tensor) -> None:
        storage = t.untyped_storage()
        key = storage.data_ptr()
        known = self.live.get(key)
        if known is None or known[0].expired():
            self.live[key] = (StorageWeakRef(storage), storage.nbytes())

    def alive(self) -> int:
        for key in [k for k, (ref, _) in self.live.items() if ref.expired()]:
            del self.live[key]
        return sum(n for _, n in self.live.values())

    def alive_keys(self) -> set[int]:
        self.alive()
        return set(self.live)


class SavedTensors(torch.autograd.graph.saved_tensors_hooks):
    """The storages autograd saves for backward (outside checkpointed regions)."""

    def __init__(self, excluded: set[int]) -> None:
        self.saved: dict[int, int] = {}

        def pack(t: torch.Tensor) -> torch.Tensor:
            key = _storage_key(t)
            if key not in excluded:
                self.saved[key] = t.untyped_storage().nbytes()
            return t

        super().__init__(pack, lambda t: t)


def parameter_storages(model: torch.nn.Module) -> set[int]:
    return {_storage_key(p) for p in model.parameters()}


def measure_peak(
    config: GPTConfig, mode: CheckpointMode, seq_len: int, micro_batch: int, every_k: int
) -> LiveActivations:
    """One forward and backward of the switchyard GPT with the trainer's checkpointing `mode`."""
    torch.manual_seed(0)
    model = GPT(config)
    apply_activation_checkpointing(model, mode, every_k)
    tokens = torch.randint(0, 256, (micro_batch, seq_len + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    meter = LiveActivations(parameter_storages(model))
    with meter:
        next_token_loss(model(x), y).backward()
    return meter
