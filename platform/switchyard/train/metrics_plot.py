"""A run's metrics file drawn as a PNG: loss (and validation loss) and global tokens/s against step.

Uses matplotlib's object API (`Figure`, no `pyplot`): no global figure state, no GUI backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.figure import Figure


def plot_metrics(rows: list[dict[str, Any]], out: Path, title: str) -> Path:
    """Write the PNG of `rows` (`metrics_log.read_metrics`) to `out`."""
    steps = [row["step"] for row in rows]
    figure = Figure(figsize=(8, 6), layout="constrained")
    loss_axes, speed_axes = figure.subplots(2, 1, sharex=True)
    loss_axes.plot(steps, [row["loss"] for row in rows], marker=".", label="train")
    held_back = [(row["step"], row["val_loss"]) for row in rows if row.get("val_loss") is not None]
    if held_back:
        loss_axes.plot(*zip(*held_back, strict=True), marker="o", color="tab:orange", label="validation")
        loss_axes.legend()
    loss_axes.set_ylabel("loss")
    loss_axes.grid(alpha=0.3)
    speed_axes.plot(steps, [row["tokens_per_s"] for row in rows], marker=".", color="tab:green")
    speed_axes.set_ylabel("tokens/s (all ranks)")
    speed_axes.set_xlabel("step")
    speed_axes.grid(alpha=0.3)
    figure.suptitle(title)
    out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(out, format="png", dpi=100)
    return out
