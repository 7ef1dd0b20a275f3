"""Per-step measurements aggregated into one metrics line every `log_every_steps` steps.

A line holds the logged step's loss (mean over ranks), validation loss when evaluated,
learning rate and gradient norm
(before clipping), and, over the steps since the previous line, the wall time per optimizer
step, global tokens per second and MFU, plus the process's peak memory. Arithmetic only, on
numbers the trainer measured (no torch calls, no Ray). Model FLOPs come from the planner's
formula (`switchyard.train.plan.compute.step_flops`), so a measured MFU and the planner's
assumed one are the same arithmetic.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from switchyard.train.plan.compute import step_flops
from switchyard.train.plan.from_spec import spec_input
from switchyard.train.spec import JobSpec
from switchyard.train.strategy import CheckpointMode

SCALARS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s", "mfu", "memory_bytes")
"""The numeric fields every line has, in the order TensorBoard and the plot show them."""
OPTIONAL_SCALARS = ("val_loss",)
"""Numeric fields only some lines have (lines written before them lack the key)."""


@dataclass(frozen=True)
class StepCost:
    """What one optimizer step does, fixed for the whole job."""

    tokens_per_step: int
    """Global: micro-batch x accumulation steps x sequence length x ranks."""
    model_flops_per_device: float
    """Model FLOPs one device does per optimizer step (recomputation excluded)."""
    peak_flops_per_device: float | None
    """The declared dense peak (`peak_tflops_per_device`); None when not declared."""

    def mfu(self, step_time_s: float) -> float | None:
        if self.peak_flops_per_device is None:
            return None
        return self.model_flops_per_device / (step_time_s * self.peak_flops_per_device)


def step_cost(spec: JobSpec, world_size: int) -> StepCost:
    planned = spec_input(spec)
    # MFU counts model FLOPs: recomputed forwards are not useful work (PaLM, appendix B).
    flops = step_flops(planned.shape, replace(planned.job, checkpointing=CheckpointMode.NONE)).value
    data = spec.data
    tokens = data.micro_batch_size * data.grad_accum_steps * data.seq_len * world_size
    peak = spec.peak_tflops_per_device
    return StepCost(tokens, flops, None if peak is None else peak * 1e12)


@dataclass(frozen=True)
class MetricsLine:
    step: int
    loss: float
    lr: float
    grad_norm: float | None
    tokens_per_s: float
    step_time_s: float
    """Wall seconds per optimizer step over the steps since the previous line, checkpoint
    saves excluded."""
    mfu: float | None
    memory_bytes: int
    memory_kind: str
    """`cuda_max_allocated` or `peak_rss` (see `switchyard.train.memory.peak_memory`)."""
    val_loss: float | None = None
    """Mean loss over the held-back split, on the lines where it was evaluated."""

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        norm = "-" if self.grad_norm is None else f"{self.grad_norm:.3f}"
        mfu = "-" if self.mfu is None else f"{self.mfu:.2%}"
        val = "" if self.val_loss is None else f" val_loss {self.val_loss:.4f}"
        return (
            f"step {self.step} loss {self.loss:.4f} lr {self.lr:.3e} grad_norm {norm} "
            f"tokens/s {self.tokens_per_s:,.0f} step_time {self.step_time_s * 1000:.1f}ms mfu {mfu} "
            f"memory {self.memory_bytes / 2**20:,.1f}MiB ({self.memory_kind}){val}"
        )


class StepWindow:
    """The optimizer steps since the last metrics line and the wall time they took.

    Times must be read right after the host has waited for the device (a metrics line is
    written just after the loss sync), so the window's time is the device's too.
    """

    def __init__(self, cost: StepCost, started: float) -> None:
        self.cost = cost
        self._started = started
        self._steps = 0
        self._excluded = 0.0

    def add_step(self) -> None:
        self._steps += 1

    def exclude(self, seconds: float) -> None:
        """Time inside the window that is not training (a checkpoint save)."""
        self._excluded += seconds

    def close(
        self,
        now: float,
        *,
        step: int,
        loss: float,
        lr: float,
        grad_norm: float | None,
        memory_bytes: int,
        memory_kind: str,
        val_loss: float | None = None,
    ) -> MetricsLine:
        """The line for the steps so far; the next window starts at `now`."""
        if self._steps == 0:
            raise RuntimeError(f"metrics line at step {step} with no step since the previous one")
        step_time = (now - self._started - self._excluded) / self._steps
        line = MetricsLine(
            step=step,
            loss=loss,
            lr=lr,
            grad_norm=grad_norm,
            tokens_per_s=self.cost.tokens_per_step / step_time,
            step_time_s=step_time,
            mfu=self.cost.mfu(step_time),
            memory_bytes=memory_bytes,
            memory_kind=memory_kind,
            val_loss=val_loss,
        )
        self._started, self._steps, self._excluded = now, 0, 0.0
        return line
