"""Fake upstreams on 127.0.0.1 that speak OpenAI's, Anthropic's and Bedrock's wire formats.

Each validates what it receives against the official SDK's request type (or botocore's
service model) and answers 400 when the request is wrongly shaped, so an adapter that
sends the wrong shape fails its test. Faults are queued per upstream and consumed one per
request: latency, 429 + Retry-After, 500, a reset connection, malformed JSON, a stream that
dies midway, or an answer of a given text.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.parse
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from botocore.validate import ParamValidator
from gw_server import ThreadedServer
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError

OPENAI_KEY = "sk-test-openai-0123456789"
ANTHROPIC_KEY = "sk-ant-test-0123456789"

_CONVERSE = botocore.session.get_session().get_service_model("bedrock-runtime").operation_model("Converse")
_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    "openai": TypeAdapter(CompletionCreateParamsNonStreaming),
    "openai-stream": TypeAdapter(CompletionCreateParamsStreaming),
    "anthropic": TypeAdapter(MessageCreateParamsNonStreaming),
    "anthropic-stream": TypeAdapter(MessageCreateParamsStreaming),
}
_KEYS = {
    "openai": set(CompletionCreateParamsStreaming.__annotations__),
    "anthropic": set(MessageCreateParamsStreaming.__annotations__),
}


@dataclass
class Fault:
    kind: str  # latency | status | reset | malformed | die_midway | reply | filtered
    delay_s: float = 0.0
    status: int = 500
    retry_after: str | None = None
    text: str | None = None
    error_type: str | None = None


@dataclass
class Upstream:
    """The state of one fake provider: its queued faults, default reply and what it saw."""

    reply: str = "Hello from the fake upstream."
    faults: deque[Fault] = field(default_factory=deque)
    sticky: Fault | None = None  # applies to every request while set (an outage)
    received: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def next_fault(self) -> Fault | None:
        if self.faults:
            return self.faults.popleft()
        return self.sticky

    def reset(self) -> None:
        self.reply = "Hello from the fake upstream."
        self.faults.clear()
        self.sticky = None
        self.received.clear()
        self.rejected.clear()


class FakeUpstreams:
    """One server hosting all three wire formats (paths differ), each with its own state."""

    def __init__(self) -> None:
        self.openai = Upstream()
        self.anthropic = Upstream()
        self.bedrock = Upstream()
        self._server = ThreadedServer(self)

    @property
    def port(self) -> int:
        return self._server.port

    @property
    def base(self) -> str:
        return self._server.url

    def reset(self) -> None:
        for u in (self.openai, self.anthropic, self.bedrock):
            u.reset()

    def start(self) -> None:
        self._server.__enter__()

    def stop(self) -> None:
        self._server.__exit__(None, None, None)

    # ------------------------------------------------------------ ASGI

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = b""
        while True:
            msg = await receive()
            body += msg.get("body", b"")
            if not msg.get("more_body"):
                break
        headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
        path = scope["path"]
        if path == "/v1/chat/completions":
            await self._openai(headers, body, send)
        elif path == "/v1/messages":
            await self._anthropic(headers, body, send)
        elif path.startswith("/model/") and path.endswith("/converse"):
            model_id = urllib.parse.unquote(path[len("/model/") : -len("/converse")])
            await self._bedrock(headers, model_id, body, send)
        else:
            await _json(send, 404, {"error": {"type": "not_found", "message": path}})

    async def _openai(self, headers: dict[str, str], body: bytes, send: Any) -> None:
        up = self.openai
        if headers.get("authorization") != f"Bearer {OPENAI_KEY}":
            up.rejected.append("bad credential")
            await _json(
                send, 401, {"error": {"type": "invalid_request_error", "code": "invalid_api_key", "message": "bad key"}}
            )
            return
        req = _validate(up, body, "openai", lambda r: "openai-stream" if r.get("stream") else "openai")
        if req is None:
            await _json(
                send,
                400,
                {"error": {"type": "invalid_request_error", "code": "invalid_shape", "message": up.rejected[-1]}},
            )
            return
        fault = up.next_fault()
        text = await _apply_common(fault, send, {"error": {"type": "server_error", "message": "boom"}})
        if text is _HANDLED:
            return
        reply = text if isinstance(text, str) else up.reply
        if req.get("stream"):
            await _sse_start(send)
            chunks = [reply[i : i + 8] for i in range(0, len(reply), 8)] or [""]
            for n, piece in enumerate(chunks):
                if fault is not None and fault.kind == "die_midway" and n == len(chunks) // 2:
                    return  # the connection drops mid-stream, no [DONE]
                await _sse(
                    send,
                    {
                        "id": "c1",
                        "object": "chat.completion.chunk",
                        "created": 1,
                        "model": req["model"],
                        "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}],
                    },
                )
            await _sse(
                send,
                {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": req["model"],
                    "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
                },
            )
            await _sse(
                send,
                {
                    "id": "c1",
                    "object": "chat.completion.chunk",
                    "created": 1,
                    "model": req["model"],
                    "choices": [],
                    "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
                },
            )
            await _sse_raw(send, b"data: [DONE]\n\n", more=False)
            return
        finish = "content_filter" if fault is not None and fault.kind == "filtered" else "stop"
        await _json(
            send,
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": req["model"],
                "choices": [{"index": 0, "message": {"role": "assistant", "content": reply}, "finish_reason": finish}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            },
        )

    async def _anthropic(self, headers: dict[str, str], body: bytes, send: Any) -> None:
        up = self.anthropic
        if headers.get("x-api-key") != ANTHROPIC_KEY or headers.get("anthropic-version") != "2023-06-01":
            up.rejected.append("bad credential or version")
            await _json(send, 401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}})
            return
        req = _validate(up, body, "anthropic", lambda r: "anthropic-stream" if r.get("stream") else "anthropic")
        if req is not None:
            roles = [m["role"] for m in req["messages"]]
            if roles[0] != "user" or any(a == b for a, b in itertools.pairwise(roles)):
                up.rejected.append(f"turns must alternate starting with user: {roles}")
                req = None
        if req is None:
            await _json(
                send, 400, {"type": "error", "error": {"type": "invalid_request_error", "message": up.rejected[-1]}}
            )
            return
        fault = up.next_fault()
        text = await _apply_common(fault, send, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
        if text is _HANDLED:
            return
        reply = text if isinstance(text, str) else up.reply
        if req.get("stream"):
            await _sse_start(send)
            await _sse(
                send,
                {
                    "type": "message_start",
                    "message": {
                        "id": "msg_1",
                        "type": "message",
                        "role": "assistant",
                        "content": [],
                        "model": req["model"],
                        "usage": {"input_tokens": 13, "output_tokens": 1},
                    },
                },
            )
            await _sse(send, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
            chunks = [reply[i : i + 8] for i in range(0, len(reply), 8)] or [""]
            for n, piece in enumerate(chunks):
                if fault is not None and fault.kind == "die_midway" and n == len(chunks) // 2:
                    return
                await _sse(
                    send, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
                )
            await _sse(send, {"type": "content_block_stop", "index": 0})
            await _sse(
                send, {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 9}}
            )
            await _sse_raw(send, b'event: message_stop\ndata: {"type": "message_stop"}\n\n', more=False)
            return
        await _json(
            send,
            200,
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": req["model"],
                "content": [{"type": "text", "text": reply}],
                "stop_reason": "end_turn",
                "usage": {"input_tokens": 13, "output_tokens": 9},
            },
        )

    async def _bedrock(self, headers: dict[str, str], model_id: str, body: bytes, send: Any) -> None:
        up = self.bedrock
        if "authorization" not in headers or "AWS4-HMAC-SHA256" not in headers["authorization"]:
            up.rejected.append("request is not SigV4-signed")
            await _json(send, 403, {"message": "missing signature"}, {"x-amzn-errortype": "AccessDeniedException"})
            return
        try:
            params = {"modelId": model_id, **json.loads(body)}
        except ValueError:
            up.rejected.append("body is not JSON")
            params = None
        if params is not None:
            report = ParamValidator().validate(params, _CONVERSE.input_shape)
            if report.has_errors():
                up.rejected.append(report.generate_report())
                params = None
        if params is None:
            await _json(send, 400, {"message": up.rejected[-1]}, {"x-amzn-errortype": "ValidationException"})
            return
        up.received.append(params)
        fault = up.next_fault()
        if fault is not None and fault.kind == "status":
            error_type = fault.error_type or (
                "ThrottlingException" if fault.status == 429 else "InternalServerException"
            )
            await _json(send, fault.status, {"message": "injected"}, {"x-amzn-errortype": error_type})
            return
        text = await _apply_common(fault, send, {"message": "boom"})
        if text is _HANDLED:
            return
        reply = text if isinstance(text, str) else up.reply
        await _json(
            send,
            200,
            {
                "output": {"message": {"role": "assistant", "content": [{"text": reply}]}},
                "stopReason": "end_turn",
                "usage": {"inputTokens": 17, "outputTokens": 5, "totalTokens": 22},
                "metrics": {"latencyMs": 3},
            },
        )


class _Handled:
    pass


_HANDLED = _Handled()


def _validate(up: Upstream, body: bytes, family: str, which: Any) -> dict[str, Any] | None:
    try:
        req = json.loads(body)
        unknown = set(req) - _KEYS[family]
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        validated = _ADAPTERS[which(req)].validate_python(req)
        list(validated["messages"])  # Iterable fields validate lazily: force them
    except (ValueError, ValidationError, KeyError) as exc:
        up.rejected.append(f"{type(exc).__name__}: {str(exc)[:500]}")
        return None
    up.received.append(req)
    return req  # type: ignore[no-any-return]


async def _apply_common(fault: Fault | None, send: Any, error_body: dict[str, Any]) -> str | _Handled | None:
    """Applies latency, status, reset and malformed faults; returns a reply override or None."""
    if fault is None:
        return None
    if fault.kind == "latency":
        await asyncio.sleep(fault.delay_s)
        return fault.text
    if fault.kind == "status":
        extra = {"retry-after": fault.retry_after} if fault.retry_after else {}
        body = error_body
        if fault.error_type is not None and "error" in body:
            body = {**body, "error": {**body["error"], "type": fault.error_type, "code": fault.error_type}}
        await _json(send, fault.status, body, extra)
        return _HANDLED
    if fault.kind == "reset":
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"500")]})
        await send({"type": "http.response.body", "body": b'{"id": "chatc', "more_body": True})
        return _HANDLED  # returning mid-body makes the server drop the connection
    if fault.kind == "malformed":
        data = b'{"choices": [ this is not json'
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
            }
        )
        await send({"type": "http.response.body", "body": data})
        return _HANDLED
    if fault.kind == "reply":
        return fault.text
    return None  # die_midway is handled by the streaming branch


async def _json(send: Any, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    hdrs = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    hdrs += [(k.encode(), v.encode()) for k, v in (headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": hdrs})
    await send({"type": "http.response.body", "body": data})


async def _sse_start(send: Any) -> None:
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})


async def _sse(send: Any, event: dict[str, Any]) -> None:
    await _sse_raw(send, f"data: {json.dumps(event)}\n\n".encode(), more=True)


async def _sse_raw(send: Any, data: bytes, more: bool) -> None:
    await send({"type": "http.response.body", "body": data, "more_body": more})
