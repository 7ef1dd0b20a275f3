"""What the pipeline answers: the result types, the headers every response carries, and the
stream bodies that wrap a result (admission slot held to the last byte, a buffered answer
replayed as a stream). Pure: no I/O beyond the bytes a body yields."""

from __future__ import annotations

import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Literal

from switchyard.gateway.admission_control import Ticket
from switchyard.gateway.errors import GatewayError
from switchyard.gateway.seams import Usage
from switchyard.gateway.wire import chunk_body, sse

H_REQUEST_ID = "x-switchyard-request-id"
H_PROVIDER = "x-switchyard-provider"
H_MODEL = "x-switchyard-model"
H_PROMPT = "x-switchyard-prompt-version"
H_FALLBACK = "x-switchyard-fallback"
H_REPLAY = "x-switchyard-idempotent-replay"
H_BUDGET_WARNING = "x-switchyard-budget-warning"


@dataclass(frozen=True)
class JSONResult:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True)
class StreamResult:
    headers: dict[str, str]
    body: AsyncIterator[bytes]
    status: int = 200


Result = JSONResult | StreamResult
ContractResult = Literal["valid", "invalid", "not_declared", "not_reached"]


def error_result(err: GatewayError, hdr: dict[str, str]) -> JSONResult:
    return JSONResult(err.status, err.body(), {**hdr, **err.headers})


def release_after(body: AsyncIterator[bytes], ticket: Ticket) -> AsyncIterator[bytes]:
    """The stream holds its admission slot until its last byte (or its failure)."""

    async def relay() -> AsyncIterator[bytes]:
        try:
            async for chunk in body:
                yield chunk
        finally:
            ticket.release()
            close = getattr(body, "aclose", None)  # a client that left closes the body now, as before
            if close is not None:
                await close()

    stream = relay()
    # A stream the server never starts (the client left first) never runs `finally`.
    weakref.finalize(stream, ticket.release)
    return stream


async def replay_stream(
    request_id: str, model: str, text: str, finish: str, usage: Usage, include_usage: bool
) -> AsyncIterator[bytes]:
    created = int(time.time())
    yield sse(chunk_body(request_id, model, created, role=True, text=""))
    yield sse(chunk_body(request_id, model, created, text=text))
    yield sse(chunk_body(request_id, model, created, finish_reason=finish))
    if include_usage:
        yield sse(chunk_body(request_id, model, created, usage=usage))
    yield sse("[DONE]")
