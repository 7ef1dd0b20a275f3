"""What the training loop needs from a strategy: one optimizer step over micro-batches,
checkpoint save/load, and a count of the bytes each rank holds.

`TorchEngine` (DDP, FSDP2) and `DeepSpeedEngine` (ZeRO 1/2/3) implement it (plus the
validation forward, `evaluate`); the loop never
branches on the strategy.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Protocol

from torch import Tensor, nn

from switchyard.train.memory import RankMemory

Batch = tuple[Tensor, Tensor]


class StepOutput(NamedTuple):
    """One optimizer step's measurements, still on the device (reading them waits for it)."""

    loss: Tensor
    """This rank's mean micro-batch loss (detached)."""
    grad_norm: Tensor | None
    """Total L2 norm of the whole model's gradient before clipping, the same on every rank;
    None when the engine does not compute it."""


class TrainEngine(Protocol):
    model: nn.Module
    checkpoint_format: str

    def train_step(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        """Forward and backward every micro-batch, then one optimizer step at `lr`."""
        ...

    def evaluate(self, batches: list[Batch]) -> Tensor:
        """This rank's next-token loss summed over every target token of `batches`, in eval
        mode under `no_grad` (a device scalar); the model is back in training mode after."""
        ...

    def save(self, directory: Path) -> None:
        """Write this rank's part of model and optimizer state into `directory`."""
        ...

    def load(self, directory: Path) -> None:
        """Restore model and optimizer state from a merged checkpoint directory."""
        ...

    def memory(self) -> RankMemory: ...
