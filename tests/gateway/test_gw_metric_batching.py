"""Ray metric updates summed in the process (`MetricBatch`): the totals Ray records are the
per-request sums, per tag set; the last updates before a quiet period are recorded within
`flush_s` with no further traffic; a gauge records its latest value; without an event loop
an update is recorded at once. Ray's metric objects are stood in for by recorders of their
`inc`/`set` calls (the batching, not Ray, is under test)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from switchyard.cluster.metric_batching import MetricBatch

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Recorded:
    """What Ray's Counter.inc / Gauge.set were called with."""

    def __init__(self) -> None:
        self.calls: list[tuple[float, dict[str, str] | None]] = []

    def inc(self, value: float = 1.0, tags: dict[str, str] | None = None) -> None:
        assert value > 0  # Ray's Counter refuses anything else
        self.calls.append((value, tags))

    def set(self, value: float, tags: dict[str, str] | None = None) -> None:
        self.calls.append((value, tags))


QA = (("team", "qa"), ("flow", "plain"))
SUPPORT = (("team", "support"), ("flow", "reply"))


async def test_counts_are_summed_per_tag_set_and_recorded_after_the_interval() -> None:
    batch, requests = MetricBatch(flush_s=0.05), Recorded()
    for _ in range(100):
        batch.inc(requests, 1.0, QA)
    batch.inc(requests, 2.5, SUPPORT)
    assert requests.calls == []  # nothing reaches Ray per request
    await asyncio.sleep(0.15)  # no further traffic: the scheduled flush still runs
    assert sorted(requests.calls, key=str) == sorted([(100.0, dict(QA)), (2.5, dict(SUPPORT))], key=str)
    batch.inc(requests, 1.0, QA)
    await asyncio.sleep(0.15)
    assert requests.calls[-1] == (1.0, dict(QA)) and len(requests.calls) == 3
    assert batch.pending == {"counters": 0, "gauges": 0}


async def test_a_gauge_records_only_its_latest_value() -> None:
    batch, backlog = MetricBatch(flush_s=0.05), Recorded()
    for value in (1.0, 2.0, 3.0, 0.0):
        batch.set(backlog, value, (("replica", "r1"),))
    await asyncio.sleep(0.15)
    assert backlog.calls == [(0.0, {"replica": "r1"})]


async def test_without_an_event_loop_an_update_is_recorded_at_once() -> None:
    batch, refreshes = MetricBatch(flush_s=60), Recorded()
    # A worker thread (a policy refresh in `asyncio.to_thread`): no loop runs there.
    worker = threading.Thread(target=batch.inc, args=(refreshes, 1.0, (("source", "policies"),)))
    worker.start()
    worker.join()
    assert refreshes.calls == [(1.0, {"source": "policies"})]
