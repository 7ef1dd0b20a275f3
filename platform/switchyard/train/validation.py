"""The held-back validation split and its loss.

`split_windows` draws, from the job seed alone, which windows of the corpus are held back;
training (`TokenBatches(windows=...)`, built by `training_and_held_back`) never reads them.
`HeldBackLoss` gives each rank an equal, contiguous share of them, runs it through the engine
under `no_grad` and all-reduces the summed token losses once, so every rank gets the same
mean over every held-back token.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor

from switchyard.train.data import DataSourceError, TokenBatches, window_count, window_rows
from switchyard.train.engine import Batch, TrainEngine
from switchyard.train.spec import JobSpec

SPLIT_STREAM = 0x5EED_0FF
"""Offsets the seed of the split's generator from the per-epoch training orders'."""


class WindowSplit(NamedTuple):
    train: Tensor
    """Window indices training reads, ascending."""
    held_back: Tensor
    """Window indices only validation reads, ascending."""


def split_windows(n_windows: int, held_back: int, seed: int) -> WindowSplit:
    """Hold back `held_back` of `n_windows` windows, chosen by `seed` alone: every rank, and
    every resume, draws the same split."""
    if not 0 < held_back < n_windows:
        raise DataSourceError(
            f"validation.sequences ({held_back}) must be fewer than the corpus's {n_windows} windows of data.seq_len"
        )
    g = torch.Generator().manual_seed(seed * 1_000_003 + SPLIT_STREAM)
    order = torch.randperm(n_windows, generator=g)
    return WindowSplit(order[held_back:].sort().values, order[:held_back].sort().values)


class HeldBackLoss:
    """This rank's share of the held-back windows, as micro-batches kept on the device."""

    def __init__(
        self,
        tokens: Tensor,
        held_back: Tensor,
        seq_len: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        device: torch.device,
    ) -> None:
        per_rank, remainder = divmod(held_back.numel(), world_size)
        if remainder or per_rank % micro_batch_size:
            raise ValueError(
                f"validation.sequences ({held_back.numel()}) must be a multiple of the ranks ({world_size}) x "
                f"data.micro_batch_size ({micro_batch_size}), so every rank runs the same forwards"
            )
        share = held_back[rank * per_rank : (rank + 1) * per_rank]
        self.batches: list[Batch] = [
            tuple(t.to(device) for t in window_rows(tokens, ids, seq_len))  # type: ignore[misc]
            for ids in share.split(micro_batch_size)
        ]
        self.tokens = held_back.numel() * seq_len
        """Held-back target tokens over all ranks."""

    def mean(self, engine: TrainEngine) -> float:
        """Mean next-token loss over every held-back token (collective: one all-reduce)."""
        total = engine.evaluate(self.batches).float().reshape(1)
        if dist.is_initialized():
            dist.all_reduce(total)
        return float(total.item()) / float(self.tokens)


def training_and_held_back(
    tokens: Tensor, spec: JobSpec, rank: int, world_size: int, device: torch.device
) -> tuple[TokenBatches, HeldBackLoss | None]:
    """This rank's training batches and, with validation on, its share of the windows they
    never read. Without validation training reads every window, in the order it always had."""
    data = spec.data
    if not spec.validation.every_steps:
        return TokenBatches(tokens, data.seq_len, data.micro_batch_size, rank, world_size, spec.seed), None
    split = split_windows(window_count(tokens, data.seq_len), spec.validation.sequences, spec.seed)
    batches = TokenBatches(
        tokens, data.seq_len, data.micro_batch_size, rank, world_size, spec.seed, windows=split.train
    )
    held_back = HeldBackLoss(tokens, split.held_back, data.seq_len, data.micro_batch_size, rank, world_size, device)
    return batches, held_back
