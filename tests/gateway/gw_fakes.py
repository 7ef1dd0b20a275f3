"""Fake upstreams on 127.0.0.1 that speak OpenAI's, Anthropic's and Bedrock's wire formats.

Each validates what it receives against the official SDK's request type (or botocore's
service model), every nested part included, plus the rules those types cannot state (turns
alternate; each tool call is answered by a tool result in the next turn; Bedrock needs
`toolConfig` once the history uses tools), and answers 400 when the request is wrongly
shaped, so an adapter that sends the wrong shape fails its test. Every accepted request is
recorded, parsed, in its upstream's `received` (Bedrock's with its `modelId`).

Faults are queued per upstream and consumed one per request: latency, 429 + Retry-After,
500, a reset connection, malformed JSON, a stream that dies midway, an answer of a given
text, or tool calls (`Fault("tool_calls", calls=[(name, arguments), ...])`), each in the
upstream's own wire format, streaming and not: OpenAI's `message.tool_calls` /
`delta.tool_calls` chunks with finish `tool_calls`; Anthropic's `tool_use` blocks /
`content_block_start` + `input_json_delta` events with stop reason `tool_use`; Bedrock's
`toolUse` blocks with stopReason `tool_use`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import urllib.parse
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import botocore.session
from anthropic.types.message_create_params import (
    MessageCreateParamsNonStreaming,
    MessageCreateParamsStreaming,
)
from botocore.validate import ParamValidator
from gw_server import ThreadedServer, request_body
from openai.types.chat.completion_create_params import (
    CompletionCreateParamsNonStreaming,
    CompletionCreateParamsStreaming,
)
from pydantic import TypeAdapter, ValidationError

OPENAI_KEY = "sk-test-openai-0123456789"
ANTHROPIC_KEY = "sk-ant-test-0123456789"
PNG_DATA_URL = (  # a 1x1 PNG, for image messages
    "data:image/png;base64,"
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
)

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


ToolCallSpec = tuple[str, dict[str, Any]]  # a scripted tool call: (function name, arguments)


@dataclass
class Fault:
    kind: str  # latency | status | reset | malformed | reply | filtered | tool_calls; OpenAI streams:
    #   die_midway | stall_midway | stall_before_done | no_usage
    delay_s: float = 0.0
    status: int = 500
    retry_after: str | None = None
    text: str | None = None  # reply: the answer; tool_calls: text before the calls (none if None)
    error_type: str | None = None
    calls: list[ToolCallSpec] = field(default_factory=list)  # tool_calls: the calls, in order


@dataclass
class Upstream:
    """The state of one fake provider: its queued faults, default reply and what it saw."""

    reply: str = "Hello from the fake upstream."
    faults: deque[Fault] = field(default_factory=deque)
    sticky: Fault | None = None  # applies to every request while set (an outage)
    received: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    chunk_gap_s: float = 0.0  # pause between streamed content chunks (benchmarks pace a stream with it)

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
        self.chunk_gap_s = 0.0


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
        body = await request_body(receive)
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
        reply, calls = _answer(up, fault, text)
        if req.get("stream"):
            await _openai_stream(send, req["model"], reply, calls, fault, up.chunk_gap_s)
            return
        finish = "content_filter" if fault is not None and fault.kind == "filtered" else "stop"
        message: dict[str, Any] = {"role": "assistant", "content": reply}
        if calls:
            message = {"role": "assistant", "content": reply or None, "tool_calls": _openai_tool_calls(calls)}
            finish = "tool_calls"
        await _json(
            send,
            200,
            {
                "id": "chatcmpl-fake",
                "object": "chat.completion",
                "created": 1,
                "model": req["model"],
                "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                "usage": {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18},
            },
        )

    async def _anthropic(self, headers: dict[str, str], body: bytes, send: Any) -> None:
        up = self.anthropic
        if headers.get("x-api-key") != ANTHROPIC_KEY or headers.get("anthropic-version") != "2023-06-01":
            up.rejected.append("bad credential or version")
            await _json(send, 401, {"type": "error", "error": {"type": "authentication_error", "message": "bad key"}})
            return
        req = _validate(
            up,
            body,
            "anthropic",
            lambda r: "anthropic-stream" if r.get("stream") else "anthropic",
            _anthropic_problem,
        )
        if req is None:
            await _json(
                send, 400, {"type": "error", "error": {"type": "invalid_request_error", "message": up.rejected[-1]}}
            )
            return
        fault = up.next_fault()
        text = await _apply_common(fault, send, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
        if text is _HANDLED:
            return
        reply, calls = _answer(up, fault, text)
        if req.get("stream"):
            await _anthropic_stream(send, req["model"], reply, calls, fault)
            return
        content: list[dict[str, Any]] = [{"type": "text", "text": reply}] if reply or not calls else []
        content += [
            {"type": "tool_use", "id": f"toolu_{n}", "name": name, "input": args}
            for n, (name, args) in enumerate(calls)
        ]
        await _json(
            send,
            200,
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "model": req["model"],
                "content": content,
                "stop_reason": "tool_use" if calls else "end_turn",
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
            problem = report.generate_report() if report.has_errors() else _converse_problem(params)
            if problem:
                up.rejected.append(problem)
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
        reply, calls = _answer(up, fault, text)
        content: list[dict[str, Any]] = [{"text": reply}] if reply or not calls else []
        content += [
            {"toolUse": {"toolUseId": f"tooluse_{n}", "name": name, "input": args}}
            for n, (name, args) in enumerate(calls)
        ]
        await _json(
            send,
            200,
            {
                "output": {"message": {"role": "assistant", "content": content}},
                "stopReason": "tool_use" if calls else "end_turn",
                "usage": {"inputTokens": 17, "outputTokens": 5, "totalTokens": 22},
                "metrics": {"latencyMs": 3},
            },
        )


def _answer(up: Upstream, fault: Fault | None, text: str | _Handled | None) -> tuple[str, list[ToolCallSpec]]:
    """The answer's text and tool calls: a `tool_calls` fault's calls (with its text, if
    any, before them), else a reply override or the upstream's default reply."""
    if fault is not None and fault.kind == "tool_calls":
        return fault.text or "", list(fault.calls)
    return (text if isinstance(text, str) else up.reply), []


def _pieces(text: str) -> list[str]:
    return [text[i : i + 8] for i in range(0, len(text), 8)]


def _openai_tool_calls(calls: list[ToolCallSpec]) -> list[dict[str, Any]]:
    return [
        {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
        for n, (name, args) in enumerate(calls)
    ]


async def _openai_stream(
    send: Any, model: str, reply: str, calls: list[ToolCallSpec], fault: Fault | None, gap_s: float = 0.0
) -> None:
    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": [choice]}

    await _sse_start(send)
    chunks = _pieces(reply) or ([] if calls else [""])
    for n, piece in enumerate(chunks):
        if fault is not None and fault.kind == "die_midway" and n == len(chunks) // 2:
            return  # the connection drops mid-stream, no [DONE]
        if fault is not None and fault.kind == "stall_midway" and n == len(chunks) // 2:
            await asyncio.sleep(fault.delay_s)  # the connection stays open, silent
        if gap_s and n:
            await asyncio.sleep(gap_s)
        await _sse(send, chunk({"content": piece}))
    for index, call in enumerate(_openai_tool_calls(calls)):
        # OpenAI's shape: the first piece names the call, later pieces carry argument fragments.
        head = {
            "index": index,
            "id": call["id"],
            "type": "function",
            "function": {"name": call["function"]["name"], "arguments": ""},
        }
        await _sse(send, chunk({"tool_calls": [head]}))
        for fragment in _pieces(call["function"]["arguments"]):
            await _sse(send, chunk({"tool_calls": [{"index": index, "function": {"arguments": fragment}}]}))
    await _sse(send, chunk({}, "tool_calls" if calls else "stop"))
    usage = {"prompt_tokens": 11, "completion_tokens": 7, "total_tokens": 18}
    if fault is None or fault.kind != "no_usage":  # a provider or proxy that never sends it
        last = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model, "choices": []}
        await _sse(send, {**last, "usage": usage})
    if fault is not None and fault.kind == "stall_before_done":
        await asyncio.sleep(fault.delay_s)  # answered and usage sent; the end comes late
    await _sse_raw(send, b"data: [DONE]\n\n", more=False)


async def _anthropic_stream(send: Any, model: str, reply: str, calls: list[ToolCallSpec], fault: Fault | None) -> None:
    await _sse_start(send)
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [],
        "model": model,
        "usage": {"input_tokens": 13, "output_tokens": 1},
    }
    await _sse(send, {"type": "message_start", "message": message})
    block = 0
    if reply or not calls:
        await _sse(send, {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
        chunks = _pieces(reply) or [""]
        for n, piece in enumerate(chunks):
            if fault is not None and fault.kind == "die_midway" and n == len(chunks) // 2:
                return
            await _sse(
                send, {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}}
            )
        await _sse(send, {"type": "content_block_stop", "index": 0})
        block = 1
    for n, (name, args) in enumerate(calls, start=block):
        start = {"type": "tool_use", "id": f"toolu_{n - block}", "name": name, "input": {}}
        await _sse(send, {"type": "content_block_start", "index": n, "content_block": start})
        for fragment in _pieces(json.dumps(args)):
            delta = {"type": "input_json_delta", "partial_json": fragment}
            await _sse(send, {"type": "content_block_delta", "index": n, "delta": delta})
        await _sse(send, {"type": "content_block_stop", "index": n})
    stop = "tool_use" if calls else "end_turn"
    await _sse(send, {"type": "message_delta", "delta": {"stop_reason": stop}, "usage": {"output_tokens": 9}})
    await _sse_raw(send, b'event: message_stop\ndata: {"type": "message_stop"}\n\n', more=False)


def _anthropic_problem(req: dict[str, Any]) -> str | None:
    """What the Messages API refuses that its request types cannot say: turns must
    alternate from a user turn; each tool_use is answered by a tool_result in the next turn,
    which puts its tool results first; a named tool choice names a defined tool."""
    turns = req["messages"]
    roles = [m["role"] for m in turns]
    if not roles or roles[0] != "user" or any(a == b for a, b in itertools.pairwise(roles)):
        return f"turns must alternate starting with user: {roles}"
    blocks = [m["content"] if isinstance(m["content"], list) else [] for m in turns]
    uses = [[b["id"] for b in bs if b.get("type") == "tool_use"] for bs in blocks]
    results = [[b["tool_use_id"] for b in bs if b.get("type") == "tool_result"] for bs in blocks]
    for n, bs in enumerate(blocks):
        kinds = [b.get("type") == "tool_result" for b in bs]
        if kinds != sorted(kinds, reverse=True):
            return f"messages.{n}: tool_result blocks must come first"
    problem = _pairing_problem(uses, results)
    if problem:
        return problem
    choice = req.get("tool_choice") or {}
    if choice.get("type") == "tool" and choice.get("name") not in {t.get("name") for t in req.get("tools") or ()}:
        return "tool_choice names a tool that is not defined"
    return None


def _converse_problem(params: dict[str, Any]) -> str | None:
    """What Converse refuses beyond its shapes: turns alternate from a user turn; toolUse
    and toolResult blocks need a toolConfig; each toolUse is answered in the next turn."""
    turns = params["messages"]
    roles = [m["role"] for m in turns]
    if not roles or roles[0] != "user" or any(a == b for a, b in itertools.pairwise(roles)):
        return f"turns must alternate starting with user: {roles}"
    uses = [[b["toolUse"]["toolUseId"] for b in m["content"] if "toolUse" in b] for m in turns]
    results = [[b["toolResult"]["toolUseId"] for b in m["content"] if "toolResult" in b] for m in turns]
    if (any(uses) or any(results)) and "toolConfig" not in params:
        return "The toolConfig field must be defined when using toolUse and toolResult content blocks."
    return _pairing_problem(uses, results)


def _pairing_problem(uses: list[list[str]], results: list[list[str]]) -> str | None:
    """Each turn's tool results answer exactly the calls of the turn before it (the last
    turn's calls may stay open: that is the answer being asked for)."""
    for n, answered in enumerate(results):
        asked = uses[n - 1] if n > 0 else []
        if set(answered) != set(asked):
            return f"messages.{n}: tool results must answer exactly the previous turn's tool calls"
    return None


class _Handled:
    pass


_HANDLED = _Handled()


def _validate(
    up: Upstream,
    body: bytes,
    family: str,
    which: Any,
    problem: Callable[[dict[str, Any]], str | None] | None = None,
) -> dict[str, Any] | None:
    """The parsed request if the SDK's request type (and `problem`, the rules types cannot
    state) accept it, recorded in `received`; else None, with the reason in `rejected`."""
    try:
        req = json.loads(body)
        unknown = set(req) - _KEYS[family]
        if unknown:
            raise ValueError(f"unknown fields {sorted(unknown)}")
        _force(_ADAPTERS[which(req)].validate_python(req))
        found = problem(req) if problem is not None else None
        if found:
            raise ValueError(found)
    except (ValueError, ValidationError, KeyError) as exc:
        up.rejected.append(f"{type(exc).__name__}: {str(exc)[:500]}")
        return None
    up.received.append(req)
    return req  # type: ignore[no-any-return]


def _force(value: Any) -> None:
    """Iterate every nested value: pydantic validates `Iterable` fields (messages, content
    parts, tools, tool calls) lazily, only as they are iterated."""
    if isinstance(value, dict):
        for v in value.values():
            _force(v)
    elif isinstance(value, Iterable) and not isinstance(value, str | bytes):
        for v in value:
            _force(v)


async def _apply_common(fault: Fault | None, send: Any, error_body: dict[str, Any]) -> str | _Handled | None:
    """Applies latency, status, reset and malformed faults; returns a reply override or None
    (tool_calls, die_midway and filtered are answered by each format's own code)."""
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
