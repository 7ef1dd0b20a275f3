"""The Philly job trace as simulator jobs, with the columns Philly lacks assigned by rule.

Philly has no workload class, priority or checkpoint columns. The rules (seeded, so a seed
fixes every assignment; see docs/scheduler.md):
  * 8+ GPUs  -> training: priority `training`, checkpoint every 30 min, bundles of 8 GPUs
    (one per node, the last one smaller), PACK inside one node group.
  * 2-4 GPUs -> training if it runs 4 h or longer, else batch fine-tune (priority `batch`,
    checkpoint every 15 min); one bundle (one node).
  * 1 GPU    -> exploratory (priority `exploratory`, no checkpoints) when it runs under 1 h;
    otherwise, by a seeded coin with p = 0.5, a batch fine-tune (checkpoint every 15 min) or
    an exploratory job that checkpoints every 60 min.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from switchyard.scheduler.core.model import PlacementStrategy, WorkloadClass

TRACE_EPOCH = datetime(2017, 9, 4, tzinfo=UTC)
"""Simulated time 0 (midnight before the first Philly job), so time of day is meaningful."""

_PRIORITY = {
    WorkloadClass.TRAINING: "training",
    WorkloadClass.BATCH_FINE_TUNE: "batch",
    WorkloadClass.EXPLORATORY: "exploratory",
}


class TraceError(ValueError):
    """The trace file is unreadable or a row is invalid; names the file, line and field."""


@dataclass(frozen=True, slots=True)
class TraceJob:
    workload_id: str
    team: str
    submit_s: float
    duration_s: float
    gpus: int
    workload_class: WorkloadClass
    priority_class: str
    checkpoint_interval_s: float | None
    bundles: tuple[int, ...]
    strategy: PlacementStrategy
    same_node_group: bool


def to_seconds(stamp: str) -> float:
    return (datetime.fromisoformat(stamp).replace(tzinfo=UTC) - TRACE_EPOCH).total_seconds()


def classify(gpus: int, duration_s: float, coin: float) -> tuple[WorkloadClass, float | None]:
    if gpus >= 8:
        return WorkloadClass.TRAINING, 1800.0
    if gpus >= 2:
        if duration_s >= 4 * 3600:
            return WorkloadClass.TRAINING, 1800.0
        return WorkloadClass.BATCH_FINE_TUNE, 900.0
    if duration_s < 3600:
        return WorkloadClass.EXPLORATORY, None
    if coin < 0.5:
        return WorkloadClass.BATCH_FINE_TUNE, 900.0
    return WorkloadClass.EXPLORATORY, 3600.0


def bundles_for(gpus: int, gpus_per_node: int) -> tuple[int, ...]:
    full, rest = divmod(gpus, gpus_per_node)
    return (gpus_per_node,) * full + ((rest,) if rest else ())


def load_philly(path: str | Path, seed: int, gpus_per_node: int = 8) -> list[TraceJob]:
    path = Path(path)
    rng = random.Random(seed)
    jobs: list[TraceJob] = []
    try:
        handle = path.open(newline="")
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err}") from None
    with handle:
        reader = csv.DictReader(handle)
        missing = {"timestamp", "duration", "num_gpus", "cluster"} - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                submit = to_seconds(row["timestamp"])
                duration = float(row["duration"])
                gpus = int(row["num_gpus"])
            except ValueError as err:
                raise TraceError(f"{path}:{line}: {err}") from None
            if gpus <= 0 or duration < 0:
                raise TraceError(f"{path}:{line}: num_gpus={gpus} duration={duration} invalid")
            workload_class, interval = classify(gpus, duration, rng.random())
            bundles = bundles_for(gpus, gpus_per_node)
            jobs.append(
                TraceJob(
                    workload_id=f"philly-{line - 1}",
                    team=row["cluster"],
                    submit_s=submit,
                    duration_s=max(duration, 1.0),
                    gpus=gpus,
                    workload_class=workload_class,
                    priority_class=_PRIORITY[workload_class],
                    checkpoint_interval_s=interval,
                    bundles=bundles,
                    strategy=PlacementStrategy.PACK,
                    same_node_group=len(bundles) > 1,
                )
            )
    jobs.sort(key=lambda j: (j.submit_s, j.workload_id))
    return jobs
