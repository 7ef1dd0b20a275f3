"""Philly's job CSV (`timestamp,duration,num_gpus,...,cluster`): `cluster` is the team."""

from __future__ import annotations

import csv
from pathlib import Path

from switchyard.scheduler.sim.trace_rows import (
    CSV_ENCODING,
    TraceError,
    TraceRow,
    cell,
    finite_seconds,
    job_gpus,
    parse_submit_time,
)

PHILLY_COLUMNS = frozenset({"timestamp", "duration", "num_gpus", "cluster"})


def read_philly(path: Path) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with path.open(newline="", encoding=CSV_ENCODING) as handle:
        reader = csv.DictReader(handle)
        missing = PHILLY_COLUMNS - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            submit = cell(path, line, row, "timestamp", parse_submit_time)
            duration = cell(path, line, row, "duration", finite_seconds)
            gpus = cell(path, line, row, "num_gpus", job_gpus)
            rows.append(TraceRow(line, f"philly-{line - 1}", submit, duration, gpus, row["cluster"]))
    return rows
