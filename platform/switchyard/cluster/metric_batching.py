"""Per-request Ray metric updates, summed in the process and recorded once per interval.

A `ray.util.metrics` record costs ~4-10 µs (tag validation, then a call into the core worker),
and a gateway request makes several; Ray exports what it has every few seconds anyway, so
summing counter increments per tag set and recording them each `flush_s` shows the same
totals with at most `flush_s` more delay. A gauge keeps only its latest value.

A flush is scheduled on the running event loop when the first update after one arrives, so
the last requests before a quiet period are still recorded; without a running loop (a worker
thread), an update is recorded at once.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any, Protocol

FLUSH_S = 1.0  # well under Ray's export interval: no delay a dashboard would show


class RayCounter(Protocol):
    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None: ...


class RayGauge(Protocol):
    def set(self, value: float, tags: dict[str, str] | None = None) -> None: ...


Tags = tuple[tuple[str, str], ...]


class MetricBatch:
    """Pending counter sums and gauge values; `flush` records them. Thread-safe."""

    def __init__(self, flush_s: float = FLUSH_S) -> None:
        self.flush_s = flush_s
        self._lock = threading.Lock()
        self._sums: dict[tuple[RayCounter, Tags], float] = {}
        self._gauges: dict[tuple[RayGauge, Tags], float] = {}
        self._scheduled = False

    def inc(self, counter: RayCounter, value: float, tags: Tags) -> None:
        with self._lock:
            key = (counter, tags)
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._schedule()

    def set(self, gauge: RayGauge, value: float, tags: Tags) -> None:
        with self._lock:
            self._gauges[(gauge, tags)] = value
        self._schedule()

    def _schedule(self) -> None:
        if self._scheduled:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self.flush()  # no loop in this thread: nothing would run a later flush
            return
        self._scheduled = True
        loop.call_later(self.flush_s, self.flush)

    def flush(self) -> None:
        with self._lock:
            sums, self._sums = self._sums, {}
            gauges, self._gauges = self._gauges, {}
            self._scheduled = False
        for (counter, tags), total in sums.items():
            counter.inc(total, dict(tags))
        for (gauge, tags), value in gauges.items():
            gauge.set(value, dict(tags))

    @property
    def pending(self) -> dict[str, Any]:
        """What is waiting to be recorded (for tests and debugging)."""
        with self._lock:
            return {"counters": len(self._sums), "gauges": len(self._gauges)}
