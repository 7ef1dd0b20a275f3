"""A Ray Train run's metrics lines as Ray gauges, for Prometheus and the Grafana training
dashboard: `ray_switchyard_train_loss`, `..._tokens_per_s`, `..._mfu`, `..._step`, tagged with
the job's name and its scheduler workload. Rank 0 sets them at every log step (the line is
all-reduced, so one rank speaks for the run); Ray drops a gauge nobody sets for a while, so a
run that stopped logging leaves the dashboard instead of freezing on its last value.
"""

from __future__ import annotations

from typing import Any

from ray.util.metrics import Gauge

TAGS = ("job", "workload")


class RunGauges:
    def __init__(self, job: str, workload_id: str | None) -> None:
        self._tags = {"job": job, "workload": workload_id or ""}
        self._gauges = {
            "loss": Gauge("switchyard_train_loss", "Training loss at the last log step.", TAGS),
            "tokens_per_s": Gauge(
                "switchyard_train_tokens_per_s", "Tokens per second over the last log window, all ranks.", TAGS
            ),
            "mfu": Gauge(
                "switchyard_train_mfu",
                "Model FLOPs utilisation over the last log window; not set where the device's peak is unknown (CPU).",
                TAGS,
            ),
            "step": Gauge("switchyard_train_step", "The optimizer step of the last metrics line.", TAGS),
        }

    def __call__(self, line: dict[str, Any]) -> None:
        for name, gauge in self._gauges.items():
            value = line.get(name)
            if isinstance(value, int | float):  # MFU is None where no peak FLOP/s is known
                gauge.set(float(value), tags=self._tags)
