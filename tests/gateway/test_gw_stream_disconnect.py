"""A streaming client that hangs up (issue "money and audit", findings 3 and 4): before the
first token, mid-stream, or before the server ever started the body. Whatever the moment,
the reservation is settled or released and the request has exactly one audit record.

Serve cancels a request's handler when its client disconnects, and Starlette closes a
streaming body the same way: the tests do exactly that to the real pipeline."""

from __future__ import annotations

import asyncio
import gc
import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness, build_harness

from switchyard.gateway.interim import CollectingAuditSink
from switchyard.gateway.providers.base import Completion, Delta, ProviderCall
from switchyard.gateway.results import StreamResult
from switchyard.gateway.seams import Exchange, Usage

pytestmark = pytest.mark.asyncio(loop_scope="session")

STREAM = json.dumps(
    {"model": "auto", "stream": True, "messages": [{"role": "user", "content": "Tell me a long story."}]}
).encode()


def _headers(gw: Harness) -> dict[str, str]:
    return {"authorization": f"Bearer {gw.keys['qa']}"}


async def _settled(gw: Harness, audited_before: int) -> list[object]:
    """The new audit records, once settle-and-audit work (which outlives the request) is done
    or 3 s have passed."""
    for _ in range(300):
        if len(gw.audit.exchanges) > audited_before and not gw.budget.held:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)  # a second record, if one were (wrongly) coming
    return list(gw.audit.exchanges)[audited_before:]


async def test_cancelled_before_the_first_token_releases_or_settles_and_audits(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.faults.append(Fault("latency", delay_s=2.0))  # the first token never comes in time
    before = len(gw.audit.exchanges)
    handler = asyncio.create_task(gw.pipeline.handle(STREAM, _headers(gw)))
    await asyncio.sleep(0.2)  # the attempt is in flight
    handler.cancel()  # what Serve does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await handler
    records = await _settled(gw, before)
    assert gw.budget.held == {}, "the cancelled stream still holds its reservation"
    assert len(records) == 1, f"{len(records)} audit records for one cancelled stream"
    record = records[0]
    assert record.status_code == 499 and record.error_code == "client_disconnected"  # type: ignore[attr-defined]
    charged = [c for c in gw.budget.settled if c[0]]
    assert charged, "the provider had the prompt: its input is charged at the estimate"


class _SlowStream:
    """An upstream that streams a token every 10 ms, so the stream is mid-way for a while."""

    name = "openai"

    async def complete(self, call: ProviderCall) -> Completion:
        raise AssertionError("streams only")

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        for _ in range(200):
            await asyncio.sleep(0.01)
            yield Delta(text="word ")
        yield Delta(finish_reason="stop", usage=Usage(20, 200))

    async def aclose(self) -> None:
        return None


class _ThreadedSink:
    """Writes off the loop, as the real audit sink does (`asyncio.to_thread`): an await that
    a cancellation can cut short."""

    def __init__(self, inner: CollectingAuditSink) -> None:
        self.inner = inner

    async def record(
        self, exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        await asyncio.to_thread(lambda: None)
        await self.inner.record(exchange, durable, within_s=within_s, withholds=withholds)

    async def open_stream(self, stand_in: Exchange, durable: bool) -> None:
        await asyncio.to_thread(lambda: None)
        await self.inner.open_stream(stand_in, durable)


async def test_client_gone_mid_stream_is_charged_and_audited_once(
    gw_dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    gw = build_harness(*gw_dirs, overrides={"openai": _SlowStream()})
    gw.parts.audit = _ThreadedSink(gw.audit)
    before = len(gw.audit.exchanges)
    result = await gw.pipeline.handle(STREAM, _headers(gw))
    assert isinstance(result, StreamResult)
    got: list[bytes] = []
    # Starlette sends a stream inside an anyio cancel scope and cancels it when the client
    # disconnects; anyio's cancellation hits every later await in the scope, `finally` included.
    with anyio.CancelScope() as scope:
        async for chunk in result.body:
            got.append(chunk)
            if len(got) == 2:
                scope.cancel()
    assert scope.cancelled_caught and len(got) == 2
    records = await _settled(gw, before)
    assert gw.budget.held == {}, "the stream cut mid-way still holds its reservation"
    assert len(records) == 1, f"{len(records)} audit records for one stream cut mid-way"
    assert records[0].status_code == 499  # type: ignore[attr-defined]
    assert records[0].cost_usd > 0  # type: ignore[attr-defined]
    await gw.aclose()


async def test_stream_body_never_started_still_settles_and_audits(gw: Harness) -> None:
    before = len(gw.audit.exchanges)
    result = await gw.pipeline.handle(STREAM, _headers(gw))
    assert isinstance(result, StreamResult)
    del result  # the client left before the server sent a byte: the body is dropped unstarted
    gc.collect()
    records = await _settled(gw, before)
    assert gw.budget.held == {}, "an unstarted stream body left its reservation held"
    assert len(records) == 1


async def test_a_finished_stream_is_audited_once_with_status_200(gw: Harness) -> None:
    before = len(gw.audit.exchanges)
    result = await gw.pipeline.handle(STREAM, _headers(gw))
    assert isinstance(result, StreamResult)
    chunks = [c async for c in result.body]
    assert chunks[-1] == b"data: [DONE]\n\n"
    records = await _settled(gw, before)
    assert [r.status_code for r in records] == [200]  # type: ignore[attr-defined]
    assert gw.budget.held == {}
