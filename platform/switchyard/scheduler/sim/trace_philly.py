"""Philly's job CSV (`timestamp,duration,num_gpus,...,cluster`): `cluster` is the team."""

from __future__ import annotations

import csv
from pathlib import Path

from switchyard.scheduler.sim.trace_rows import TraceError, TraceRow, parse_submit_time

PHILLY_COLUMNS = frozenset({"timestamp", "duration", "num_gpus", "cluster"})


def read_philly(path: Path) -> list[TraceRow]:
    rows: list[TraceRow] = []
    with path.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = PHILLY_COLUMNS - set(reader.fieldnames or [])
        if missing:
            raise TraceError(f"{path}: missing columns {sorted(missing)}")
        for line, row in enumerate(reader, start=2):
            try:
                submit = parse_submit_time(row["timestamp"])
                duration = float(row["duration"])
                gpus = int(row["num_gpus"])
            except ValueError as err:
                raise TraceError(f"{path}:{line}: {err}") from None
            if gpus <= 0 or duration < 0:
                raise TraceError(f"{path}:{line}: num_gpus={gpus} duration={duration} invalid")
            rows.append(TraceRow(line, f"philly-{line - 1}", submit, duration, gpus, row["cluster"]))
    return rows
