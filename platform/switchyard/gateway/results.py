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
from switchyard.gateway.providers.base import ToolCall, ToolCallDelta
from switchyard.gateway.seams import Headroom, Reservation, Usage
from switchyard.gateway.wire import chunk_body, sse

H_REQUEST_ID = "x-switchyard-request-id"
H_PROVIDER = "x-switchyard-provider"
H_MODEL = "x-switchyard-model"
H_PROMPT = "x-switchyard-prompt-version"
H_FALLBACK = "x-switchyard-fallback"
H_REPLAY = "x-switchyard-idempotent-replay"
H_BUDGET_WARNING = "x-switchyard-budget-warning"
H_SDK_REQUEST_ID = "x-request-id"  # what OpenAI's SDKs expose as `response._request_id`
H_COST = "x-switchyard-cost-usd"  # what this request was charged (all billed attempts)
H_BUDGET_LEFT = "x-switchyard-budget-remaining-usd"
H_SHOULD_RETRY = "x-should-retry"  # OpenAI's SDKs obey it over their own retry rules
# Answers a retry of the same request cannot change: the SDK must not re-run (and re-pay) them.
# A 502 is a chain that was exhausted: every candidate the rules allow has failed just now.
NOT_RETRYABLE = frozenset({400, 401, 402, 403, 404, 409, 413, 415, 422, 502})


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
    return JSONResult(err.status, err.body(), {**hdr, **retry_headers(err.status), **err.headers})


def retry_headers(status: int) -> dict[str, str]:
    return {H_SHOULD_RETRY: "false"} if status in NOT_RETRYABLE else {}


def cost_header(usd: float) -> str:
    return f"{usd:.8f}"


def budget_left(room: Headroom, reservation: Reservation, charged_usd: float) -> float | None:
    """The budget left once this request settles: its hold comes back, its charge goes out."""
    if room.budget_usd is None:
        return None
    return max(room.budget_usd + reservation.usd - charged_usd, 0.0)


def rate_limit_headers(room: Headroom) -> dict[str, str]:
    """OpenAI's names for what is left of the tightest request and token limits."""
    out: dict[str, str] = {}
    if room.requests is not None:
        out["x-ratelimit-remaining-requests"] = str(room.requests)
    if room.tokens is not None:
        out["x-ratelimit-remaining-tokens"] = str(room.tokens)
    return out


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
    request_id: str,
    model: str,
    text: str,
    finish: str,
    usage: Usage,
    include_usage: bool,
    tool_calls: tuple[ToolCall, ...] = (),
) -> AsyncIterator[bytes]:
    created = int(time.time())
    yield sse(chunk_body(request_id, model, created, role=True, text=""))
    if text:
        yield sse(chunk_body(request_id, model, created, text=text))
    for i, c in enumerate(tool_calls):
        whole = ToolCallDelta(i, c.id, c.name, c.arguments)
        yield sse(chunk_body(request_id, model, created, tool_calls=(whole,)))
    yield sse(chunk_body(request_id, model, created, finish_reason=finish))
    if include_usage:
        yield sse(chunk_body(request_id, model, created, usage=usage))
    yield sse("[DONE]")
