"""Where the sink builds a record: on the event loop when the work is short (nothing to redact,
small bodies, a keyring on this machine), in a worker thread otherwise (Presidio takes ms).
Either way the record stored is the same, sealed and pseudonymised."""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from _audit_helpers import make_exchange, make_flow

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.sink import INLINE_BUILD_CHARS, StoreAuditSink
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.gateway.seams import Exchange
from switchyard.policy.models import DataPolicies, RiskTier


class CountingExecutor(concurrent.futures.ThreadPoolExecutor):
    """The loop's default executor (what `asyncio.to_thread` uses), counting what it is given."""

    def __init__(self) -> None:
        super().__init__(max_workers=2)
        self.jobs: list[str] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> concurrent.futures.Future[Any]:
        # `asyncio.to_thread(func)` submits `functools.partial(context.run, func)`.
        target = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn
        self.jobs.append(getattr(target, "__qualname__", repr(target)))
        return super().submit(fn, *args, **kwargs)


@pytest.fixture
async def executor() -> AsyncIterator[CountingExecutor]:
    """Set on the loop the test runs on (`asyncio.to_thread` uses the running loop's)."""
    counting = CountingExecutor()
    yield counting
    counting.shutdown(wait=True)


async def record(sink: StoreAuditSink, executor: CountingExecutor, exchange: Exchange) -> list[str]:
    """Records `exchange` durably; the jobs the loop's default executor got meanwhile."""
    loop = asyncio.get_running_loop()
    loop.set_default_executor(executor)
    try:
        await sink.record(exchange, durable=True)
    finally:
        loop.set_default_executor(concurrent.futures.ThreadPoolExecutor())
    return executor.jobs


@pytest.fixture
def sink(tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> StoreAuditSink:
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path))
    return StoreAuditSink(builder, AuditStore.in_state_dir(tmp_path), None)


INTERNAL = make_flow(team="qa", flow="plain", data_class="internal", risk=RiskTier.HIGH)


async def test_an_internal_record_builds_on_the_loop(sink: StoreAuditSink, executor: CountingExecutor) -> None:
    exchange = make_exchange(flow=INTERNAL, text="Summarise my last three orders.", output="Here they are.")
    jobs = await record(sink, executor, exchange)
    assert not [j for j in jobs if "build" in j], jobs
    assert [j for j in jobs if "append" in j], jobs  # the durable append itself stays in a thread
    [stored] = [e.entry for e in sink.store.find(team="qa")]
    assert stored.request_id == exchange.ctx.request_id  # type: ignore[union-attr]
    assert stored.input.encrypted and stored.user not in (None, "u-42")  # type: ignore[union-attr]


async def test_a_redacted_record_builds_in_a_thread(sink: StoreAuditSink, executor: CountingExecutor) -> None:
    exchange = make_exchange()  # class personal: its bodies are scrubbed before they are stored
    jobs = await record(sink, executor, exchange)
    assert [j for j in jobs if "build" in j], jobs
    assert [j for j in jobs if "append" in j], jobs  # the durable append itself stays in a thread
    assert sink.store.count() == 1


async def test_a_large_internal_record_builds_in_a_thread(sink: StoreAuditSink, executor: CountingExecutor) -> None:
    exchange = make_exchange(flow=INTERNAL, text="x" * INLINE_BUILD_CHARS, output="ok")
    jobs = await record(sink, executor, exchange)
    assert [j for j in jobs if "build" in j], jobs
    assert [j for j in jobs if "append" in j], jobs  # the durable append itself stays in a thread
