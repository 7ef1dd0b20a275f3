"""The generic job CSV an operator exports from their own cluster (format in docs/scheduler.md).

Required columns: `submit_time` (ISO 8601, naive = UTC, or unix seconds), `duration_s`,
`gpus`, `team`. Optional: `job_id`, `priority_class`, `gpu_type`, `gang`
(`<bundles>x<GPUs per bundle>`, e.g. `4x8` for four nodes of eight GPUs). An empty optional
cell means "by rule", as when the column is absent.
"""

from __future__ import annotations

import csv
from pathlib import Path

from switchyard.scheduler.sim.trace_rows import (
    CSV_ENCODING,
    MAX_JOB_GPUS,
    TraceError,
    TraceRow,
    cell,
    finite_seconds,
    job_gpus,
    parse_submit_time,
)

GENERIC_COLUMNS = frozenset({"submit_time", "duration_s", "gpus", "team"})
OPTIONAL_COLUMNS = frozenset({"job_id", "priority_class", "gpu_type", "gang"})


def parse_gang(text: str) -> tuple[int, ...]:
    """`4x8` -> (8, 8, 8, 8): four bundles of eight GPUs."""
    count, sep, size = text.strip().lower().partition("x")
    if not sep:
        raise ValueError(f"{text!r} is not <bundles>x<GPUs per bundle>, e.g. 4x8")
    bundles, gpus = int(count), int(size)
    if bundles <= 0 or gpus <= 0:
        raise ValueError(f"{text!r}: bundles and GPUs per bundle must be positive")
    if bundles * gpus > MAX_JOB_GPUS:  # before the tuple is built
        raise ValueError(f"a job may ask for at most {MAX_JOB_GPUS:,} GPUs")
    return (gpus,) * bundles


def _required(text: str) -> str:
    if not text.strip():
        raise ValueError("must not be empty")
    return text.strip()


def _row(path: Path, line: int, row: dict[str, str]) -> TraceRow:
    gpus = cell(path, line, row, "gpus", job_gpus)
    bundles = None
    if (row.get("gang") or "").strip():
        bundles = cell(path, line, row, "gang", parse_gang)
        if sum(bundles) != gpus:
            raise TraceError(f"{path}:{line}: column 'gang': {row['gang']!r} is {sum(bundles)} GPUs, gpus is {gpus}")
    return TraceRow(
        line=line,
        workload_id=(row.get("job_id") or "").strip() or f"job-{line}",
        submit_unix_s=cell(path, line, row, "submit_time", parse_submit_time),
        duration_s=cell(path, line, row, "duration_s", finite_seconds),
        gpus=gpus,
        team=cell(path, line, row, "team", _required),
        priority_class=(row.get("priority_class") or "").strip() or None,
        gpu_type=(row.get("gpu_type") or "").strip() or None,
        bundles=bundles,
    )


def read_generic(path: Path) -> list[TraceRow]:
    with path.open(newline="", encoding=CSV_ENCODING) as handle:
        reader = csv.DictReader(handle)
        missing = GENERIC_COLUMNS - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {sorted(missing)}")
        rows = [_row(path, line, row) for line, row in enumerate(reader, start=2)]
    seen: dict[str, int] = {}
    for r in rows:
        if r.workload_id in seen:
            raise TraceError(f"{path}:{r.line}: column 'job_id': {r.workload_id!r} repeats line {seen[r.workload_id]}")
        seen[r.workload_id] = r.line
    return rows
