"""One row of a job trace as its reader found it, before the simulator's rules fill the gaps."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TypeVar

CSV_ENCODING = "utf-8-sig"
"""UTF-8, with or without the byte-order mark that spreadsheet exports put before the header."""

_T = TypeVar("_T")


class TraceError(ValueError):
    """The trace file is unreadable or a row is invalid; names the file, line and column."""


@dataclass(frozen=True, slots=True)
class TraceRow:
    line: int
    workload_id: str
    submit_unix_s: float
    duration_s: float
    gpus: int
    team: str
    priority_class: str | None = None
    """None: by rule from the GPU count and duration (see trace.py)."""
    gpu_type: str | None = None
    bundles: tuple[int, ...] | None = None
    """None: bundles of one node's GPUs (see trace.py)."""


def parse_submit_time(text: str) -> float:
    """Unix seconds from ISO 8601 (naive times are UTC) or from a plain number of unix seconds."""
    text = text.strip()
    try:
        seconds = float(text)
    except ValueError:
        stamp = datetime.fromisoformat(text)
        if stamp.tzinfo is None:
            stamp = stamp.replace(tzinfo=UTC)
        return stamp.timestamp()
    try:
        datetime.fromtimestamp(seconds, UTC)  # a date the simulator's epoch and windows can use
    except (OverflowError, OSError, ValueError):
        raise ValueError("unix seconds out of range (years 1-9999)") from None
    return seconds


def finite_seconds(text: str) -> float:
    """A duration in seconds: a finite number >= 0."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):  # also refuses NaN
        raise ValueError("must be a finite number of seconds >= 0")
    return value


def cell(path: Path, line: int, row: Mapping[str, str | None], column: str, parse: Callable[[str], _T]) -> _T:
    """Parse one cell; a bad value names the file, line and column."""
    text = row.get(column) or ""
    try:
        return parse(text)
    except ValueError as err:
        raise TraceError(f"{path}:{line}: column {column!r}: {text!r}: {err}") from None


def positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError("must be a positive integer")
    return value


MAX_JOB_GPUS = 100_000
"""The most GPUs one job may ask for, and the largest cluster the simulator replays (`--gpus`):
12,500 nodes of 8. A job's bundles, like the cluster's nodes, are built one per node, so a typo
of twenty digits would otherwise take minutes and gigabytes before the job was found never to fit
(stop 44: 6.6 GB for a job of 10^8 GPUs; `--gpus 1000000000` ran out of memory)."""


def job_gpus(text: str) -> int:
    """A job's GPU count: a positive integer up to `MAX_JOB_GPUS`."""
    value = positive_int(text)
    if value > MAX_JOB_GPUS:
        raise ValueError(f"a job may ask for at most {MAX_JOB_GPUS:,} GPUs")
    return value
