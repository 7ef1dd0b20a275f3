"""One row of a job trace as its reader found it, before the simulator's rules fill the gaps."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime


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
        return float(text)
    except ValueError:
        pass
    stamp = datetime.fromisoformat(text)
    if stamp.tzinfo is None:
        stamp = stamp.replace(tzinfo=UTC)
    return stamp.timestamp()
