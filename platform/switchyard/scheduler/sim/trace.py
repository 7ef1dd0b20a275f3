"""A job trace as simulator jobs, with the columns a trace lacks assigned by rule.

Two readers (docs/scheduler.md, "Simulator inputs"): Philly's CSV (`trace_philly`) and a
generic CSV (`trace_generic`); the header tells them apart. Simulated time 0 is the midnight
(UTC) before the trace's first job, so time of day means what it meant on the cluster.

Philly has no workload class, priority or checkpoint columns, and the generic CSV may leave
them out. The rules (seeded, so a seed fixes every assignment):
  * 8+ GPUs  -> training: priority `training`, checkpoint every 30 min, bundles of 8 GPUs
    (one per node, the last one smaller), PACK inside one node group.
  * 2-4 GPUs -> training if it runs 4 h or longer, else batch fine-tune (priority `batch`,
    checkpoint every 15 min); one bundle (one node).
  * 1 GPU    -> exploratory (priority `exploratory`, no checkpoints) when it runs under 1 h;
    otherwise, by a seeded coin with p = 0.5, a batch fine-tune (checkpoint every 15 min) or
    an exploratory job that checkpoints every 60 min.
A generic row's `priority_class` replaces the rule's priority and its `gang` the rule's bundles.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from switchyard.scheduler.core.model import PlacementStrategy, WorkloadClass
from switchyard.scheduler.sim.trace_generic import GENERIC_COLUMNS, read_generic
from switchyard.scheduler.sim.trace_philly import PHILLY_COLUMNS, read_philly
from switchyard.scheduler.sim.trace_rows import CSV_ENCODING, TraceError, TraceRow

MAX_SPAN_S = 10 * 365.25 * 86400.0
"""A trace spanning longer has a wrong date (a typo'd year): its replay would run for hours
through empty years, so it is refused naming the two rows."""

_PRIORITY = {
    WorkloadClass.TRAINING: "training",
    WorkloadClass.BATCH_FINE_TUNE: "batch",
    WorkloadClass.EXPLORATORY: "exploratory",
}


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
    gpu_type: str | None = None
    """From the generic CSV: the GPU type it asks for (used when the policy declares types)."""


@dataclass(frozen=True, slots=True)
class Trace:
    jobs: list[TraceJob]
    """Sorted by submit time."""
    epoch: datetime
    """Simulated time 0: the midnight (UTC) before the first job."""

    @property
    def first_submit_s(self) -> float:
        return self.jobs[0].submit_s if self.jobs else 0.0

    @property
    def last_submit_s(self) -> float:
        return self.jobs[-1].submit_s if self.jobs else 0.0

    def to_seconds(self, stamp: datetime) -> float:
        """Simulated seconds of a wall-clock time (naive = UTC)."""
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return (stamp - self.epoch).total_seconds()


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


def epoch_of(rows: list[TraceRow]) -> datetime:
    first = min((r.submit_unix_s for r in rows), default=0.0)
    day = datetime.fromtimestamp(first, UTC).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


def _check_span(rows: list[TraceRow], path: Path) -> None:
    if not rows:
        raise TraceError(f"{path}: no jobs: the file has a header and no rows")
    first = min(rows, key=lambda r: r.submit_unix_s)
    last = max(rows, key=lambda r: r.submit_unix_s)
    span = last.submit_unix_s - first.submit_unix_s
    if span > MAX_SPAN_S:
        raise TraceError(
            f"{path}: submit times span {span / 86400:,.0f} days, from line {first.line} "
            f"({datetime.fromtimestamp(first.submit_unix_s, UTC):%Y-%m-%d}) to line {last.line} "
            f"({datetime.fromtimestamp(last.submit_unix_s, UTC):%Y-%m-%d}); a trace may span at most "
            f"{MAX_SPAN_S / 86400 / 365.25:.0f} years: is one of those dates wrong?"
        )


def to_jobs(rows: list[TraceRow], seed: int, gpus_per_node: int, path: Path) -> Trace:
    """Rows in file order -> jobs; one seeded coin per row, drawn in file order."""
    _check_span(rows, path)
    rng = random.Random(seed)
    epoch = epoch_of(rows)
    jobs = [_job(row, rng.random(), epoch.timestamp(), gpus_per_node, path) for row in rows]
    jobs.sort(key=lambda j: (j.submit_s, j.workload_id))
    return Trace(jobs, epoch)


def _job(row: TraceRow, coin: float, epoch_s: float, gpus_per_node: int, path: Path) -> TraceJob:
    workload_class, interval = classify(row.gpus, row.duration_s, coin)
    bundles = row.bundles or bundles_for(row.gpus, gpus_per_node)
    if max(bundles) > gpus_per_node:
        raise TraceError(
            f"{path}:{row.line}: column 'gang': a bundle of {max(bundles)} GPUs exceeds a node's {gpus_per_node}"
        )
    return TraceJob(
        workload_id=row.workload_id,
        team=row.team,
        submit_s=row.submit_unix_s - epoch_s,
        duration_s=max(row.duration_s, 1.0),
        gpus=row.gpus,
        workload_class=workload_class,
        priority_class=row.priority_class or _PRIORITY[workload_class],
        checkpoint_interval_s=interval,
        bundles=bundles,
        strategy=PlacementStrategy.PACK,
        same_node_group=len(bundles) > 1,
        gpu_type=row.gpu_type,
    )


def load_trace(path: str | Path, seed: int, gpus_per_node: int = 8) -> Trace:
    """Philly's CSV or the generic CSV, told apart by the header."""
    path = Path(path)
    try:
        with path.open(newline="", encoding=CSV_ENCODING) as handle:
            header = set(next(csv.reader(handle), []))
        if header >= GENERIC_COLUMNS:
            rows = read_generic(path)
        elif header >= PHILLY_COLUMNS:
            rows = read_philly(path)
        else:
            raise TraceError(
                f"{path}: header is neither the generic CSV (needs {sorted(GENERIC_COLUMNS)}) "
                f"nor Philly's (needs {sorted(PHILLY_COLUMNS)}); missing {sorted(GENERIC_COLUMNS - header)}"
            )
    except OSError as err:
        raise TraceError(f"{path}: cannot read: {err}") from None
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not a UTF-8 text file: {err}") from None
    return to_jobs(rows, seed, gpus_per_node, path)


def load_philly(path: str | Path, seed: int, gpus_per_node: int = 8) -> list[TraceJob]:
    return load_trace(path, seed, gpus_per_node).jobs


__all__ = ["Trace", "TraceError", "TraceJob", "bundles_for", "classify", "load_philly", "load_trace", "to_jobs"]
