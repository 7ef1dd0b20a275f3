"""Per-step losses and gradient norms kept on the device until the host needs them.

Reading a device tensor on the host waits for everything queued before it. The trainer
keeps each step's loss and gradient norm where they are and syncs only when a metrics line,
a checkpoint or the end of the run needs them: one all-reduce of all the pending losses and
one copy to the host per sync, instead of an all-reduce and an `.item()` every step. Each
synced loss is checked for NaN/inf, so a non-finite loss is caught at the first sync after
it (up to `log_every_steps - 1` steps later) but named by the exact step it happened.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from switchyard.train.engine import StepOutput


@dataclass(frozen=True)
class SyncedStep:
    step: int
    loss: float
    """Mean over ranks."""
    grad_norm: float | None


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or inf: training stops, and nothing is saved from that state."""

    def __init__(self, step: int, loss: float, last_checkpoint: str | None) -> None:
        self.step = step
        self.loss = loss
        self.last_checkpoint = last_checkpoint
        where = f"last good checkpoint: {last_checkpoint}" if last_checkpoint else "no checkpoint was saved before it"
        super().__init__(f"loss is {loss} at step {step}; training stopped without saving ({where})")

    def to_dict(self) -> dict[str, Any]:
        """What a rank hands its launcher (`NonFiniteLossError(**d)` raises it there), so a
        launcher shows this one line instead of every rank's traceback."""
        return {"step": self.step, "loss": self.loss, "last_checkpoint": self.last_checkpoint}

    def __reduce__(self) -> tuple[type[NonFiniteLossError], tuple[int, float, str | None]]:
        # The default (cls, (message,)) cannot be unpickled: __init__ takes the fields.
        return (NonFiniteLossError, (self.step, self.loss, self.last_checkpoint))


class PendingSteps:
    """Steps trained since the last sync, their outputs still on the device."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._steps: list[int] = []
        self._losses: list[Tensor] = []
        self._norms: list[Tensor | None] = []

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, step: int, output: StepOutput) -> None:
        self._steps.append(step)
        self._losses.append(output.loss.detach().float())
        self._norms.append(output.grad_norm)

    def sync(self) -> list[SyncedStep]:
        """Collective (every rank, same steps): the pending steps' losses averaged over ranks,
        and their gradient norms, on the host. Every rank gets the same values, so every
        rank takes the same decision on them (`first_non_finite`)."""
        if not self._steps:
            return []
        losses = torch.stack(self._losses)
        if dist.is_initialized():
            dist.all_reduce(losses)  # SUM: gloo has no AVG
            losses /= self.world_size
        norms = self._norms if all(n is not None for n in self._norms) else None
        if norms is not None:
            losses = torch.cat([losses, torch.stack([n.float().reshape(()) for n in norms if n is not None])])
        values = losses.tolist()  # the one wait for the device
        n = len(self._steps)
        synced = [
            SyncedStep(step, values[i], values[n + i] if norms is not None else None)
            for i, step in enumerate(self._steps)
        ]
        self._steps, self._losses, self._norms = [], [], []
        return synced


def first_non_finite(steps: list[SyncedStep]) -> SyncedStep | None:
    return next((s for s in steps if not math.isfinite(s.loss)), None)
