"""Which part of a trace a run measures, and which earlier part it replays as warm-up.

`--from` / `--to` are dates (ISO 8601, naive = UTC) or fractions of the trace's span (0 = its
first submit, 1 = just after its last); default: the whole trace. Jobs submitted in the
warm-up, the period just before `--from`, run but are not measured.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime

from switchyard.scheduler.sim.trace import Trace, TraceJob

NAMED_WINDOWS = {
    "sep": ("2017-09-04", "2017-10-01"),
    "oct": ("2017-10-01", "2017-11-01"),
    "all": ("2017-09-04", "2017-11-01"),
}
"""Philly's months, kept as aliases so the documented runs reproduce."""

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNIT_S = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class ReplayWindow:
    start_s: float
    """Measured from here (simulated seconds) ..."""
    end_s: float
    """... to here, exclusive."""
    replay_from_s: float
    """Jobs submitted in [replay_from_s, start_s) are the warm-up; -inf: every earlier job."""

    def replays(self, job: TraceJob) -> bool:
        return self.replay_from_s <= job.submit_s < self.end_s

    def measures(self, job: TraceJob) -> bool:
        return self.start_s <= job.submit_s < self.end_s


def parse_duration(text: str) -> float:
    """Seconds from `90`, `90s`, `30m`, `12h` or `2d`."""
    match = _DURATION.match(text)
    if match is None:
        raise ValueError(f"duration {text!r}: expected a number with an optional unit s, m, h or d (e.g. 2d)")
    return float(match.group(1)) * _UNIT_S[match.group(2)]


def span_of(trace: Trace) -> tuple[float, float]:
    # Window ends are exclusive: the span ends one second after the last submit so that a
    # window up to fraction 1 keeps the last job.
    return trace.first_submit_s, trace.last_submit_s + 1.0


def parse_bound(text: str, trace: Trace) -> float:
    """A date or a fraction of the trace's span -> simulated seconds."""
    try:
        fraction = float(text)
    except ValueError:
        fraction = math.nan
    if not math.isnan(fraction):
        if not 0.0 <= fraction <= 1.0:
            raise ValueError(f"window bound {text!r}: a fraction must lie in 0..1 (or give a date)")
        lo, hi = span_of(trace)
        return lo + fraction * (hi - lo)
    try:
        return trace.to_seconds(datetime.fromisoformat(text))
    except ValueError:
        raise ValueError(f"window bound {text!r}: expected a date (2017-10-01, ISO 8601) or a fraction 0..1") from None


def resolve_window(trace: Trace, frm: str | None, to: str | None, warmup_s: float | None) -> ReplayWindow:
    """`warmup_s` None: every job before `frm`, or none when `frm` is not given. With no `frm`
    and a warm-up, the warm-up is the trace's first `warmup_s` seconds."""
    first, last = span_of(trace)
    if warmup_s is not None and warmup_s < 0:
        raise ValueError(f"warm-up must be >= 0 s, got {warmup_s}")
    if frm is not None:
        start = parse_bound(frm, trace)
        replay_from = -math.inf if warmup_s is None else start - warmup_s
    else:
        start = first + (warmup_s or 0.0)
        replay_from = -math.inf
    end = parse_bound(to, trace) if to is not None else last
    if end <= start:
        raise ValueError(f"window {frm or 'trace start'}..{to or 'trace end'} (after warm-up) is empty")
    return ReplayWindow(start, end, replay_from)


def select_jobs(jobs: list[TraceJob], window: ReplayWindow, max_jobs: int | None) -> list[TraceJob]:
    """The replayed jobs; with `max_jobs`, only the first N measured ones (test slices)."""
    kept = [j for j in jobs if window.replays(j)]
    if max_jobs is None:
        return kept
    inside = [j for j in kept if window.measures(j)][:max_jobs]
    before = [j for j in kept if j.submit_s < window.start_s]
    return before + inside
