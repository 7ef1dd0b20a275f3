"""Damaged upstream answers, generated: the gateway uses each one or fails it as the
provider's fault, never as its own, and bills every answer the provider sent.

A provider, a proxy in front of one or a self-hosted server can answer 200 with JSON that is
not quite its wire format: a field missing, of another type or sign, a count scaled, an
event doubled. Each example takes a valid answer of one wire format (an OpenAI chat
completion or its stream, an Anthropic message or its stream, a Bedrock Converse answer),
changes one thing in it (`tests/mutations.mutate`), and has a fake upstream on 127.0.0.1
send it to the real gateway (served by uvicorn). The flow's fallback answers validly.
What must hold for every answer:

- never a 500; a 200 carries text (or tool calls) and a finish reason of OpenAI's
  vocabulary; any other status is in OpenAI's error shape; a stream ends with `[DONE]` or an
  error event, never a dropped connection;
- one audit record, which does not say the client left (it did not);
- every 200 the damaged upstream sent is one bill; a bill at the provider's reported usage
  carries a usage the answer stated in whole, non-negative counts the ledger can hold;
  anything else is billed at the documented bound.

`make test` runs 300 derandomized examples (3,000 of the embeddings parse, which sends no
request); `SWITCHYARD_UPSTREAM_EXAMPLES=N` runs N (10 N) random ones (pytest's
`--hypothesis-seed` reproduces a run).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import os
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import requests
import yaml
from gw_harness import Harness, build_harness, make_keys, make_policies
from gw_server import ThreadedServer, request_body
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.cluster.serve_handle import ServeHandleProvider
from switchyard.gateway.circuit import BreakerSettings
from switchyard.gateway.http import create_app
from switchyard.gateway.planning import FLOW_HEADER
from switchyard.gateway.providers.base import EmbeddingCall, ProviderCall, ProviderError
from switchyard.gateway.providers.openai_compat import read_chat_completion
from switchyard.gateway.providers.openai_embeddings import parse_embeddings
from switchyard.gateway.results import H_REQUEST_ID
from switchyard.gateway.seams import Exchange, Usage
from switchyard.policy.models import MAX_CONTEXT_TOKENS, ErrorClass
from tests.mutations import mutate

EXAMPLES = int(os.environ.get("SWITCHYARD_UPSTREAM_EXAMPLES", "300"))
DERANDOMIZE = "SWITCHYARD_UPSTREAM_EXAMPLES" not in os.environ
PARSE_EXAMPLES = 10 * EXAMPLES  # a parse alone, no request: ten times as many for the same time
FINISH_REASONS = {"stop", "length", "tool_calls", "content_filter"}

OPENAI = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "created": 1,
    "model": "gpt-4o-mini-2024-07-18",
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "hello there"}, "finish_reason": "stop"}],
    "usage": {"prompt_tokens": 11, "completion_tokens": 3, "prompt_tokens_details": {"cached_tokens": 2}},
}
OPENAI_STREAM = [
    {"id": "c", "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {"role": "assistant", "content": "hel"}}]},
    {"id": "c", "model": "gpt-4o-mini", "choices": [{"index": 0, "delta": {"content": "lo"}, "finish_reason": "stop"}]},
    {"id": "c", "model": "gpt-4o-mini", "choices": [], "usage": {"prompt_tokens": 11, "completion_tokens": 3}},
]
ANTHROPIC = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-haiku",
    "content": [{"type": "text", "text": "hello there"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 11, "output_tokens": 3, "cache_read_input_tokens": 2},
}
ANTHROPIC_STREAM = [
    {
        "type": "message_start",
        "message": {"id": "msg_1", "model": "claude-haiku", "usage": {"input_tokens": 11, "output_tokens": 1}},
    },
    {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
    {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "hello there"}},
    {"type": "content_block_stop", "index": 0},
    {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {"output_tokens": 3}},
    {"type": "message_stop"},
]
BEDROCK = {
    "output": {"message": {"role": "assistant", "content": [{"text": "hello there"}]}},
    "stopReason": "end_turn",
    "usage": {"inputTokens": 11, "outputTokens": 3, "totalTokens": 14},
    "metrics": {"latencyMs": 5},
}
# wire -> (its valid answer, the catalog model the flow calls first, the flow)
WIRES: dict[str, tuple[Any, str, str]] = {
    "openai": (OPENAI, "gpt-4o-mini", "openai-first"),
    "openai-stream": (OPENAI_STREAM, "gpt-4o-mini", "openai-first"),
    "anthropic": (ANTHROPIC, "claude-haiku", "anthropic-first"),
    "anthropic-stream": (ANTHROPIC_STREAM, "claude-haiku", "anthropic-first"),
    "bedrock": (BEDROCK, "bedrock-claude-sonnet", "bedrock-first"),
}
FLOWS = {
    "openai-first": {"prompt": "assistant@1", "model": "gpt-4o-mini", "fallback": [{"model": "claude-haiku"}]},
    "anthropic-first": {"prompt": "assistant@1", "model": "claude-haiku", "fallback": [{"model": "gpt-4o-mini"}]},
    "bedrock-first": {
        "prompt": "assistant@1",
        "model": "bedrock-claude-sonnet",
        "fallback": [{"model": "claude-haiku"}],
    },
}


def _wire_of(path: str, streamed: bool) -> str:
    if path == "/v1/chat/completions":
        return "openai-stream" if streamed else "openai"
    if path == "/v1/messages":
        return "anthropic-stream" if streamed else "anthropic"
    return "bedrock"


@dataclass
class DamagedUpstream:
    """Answers every call 200: the damaged wire with `damaged`, the others with their valid
    answer; counts the 200s it sent on the damaged wire."""

    wire: str = ""
    damaged: Any = None
    sent: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        body = await request_body(receive)
        path = urllib.parse.unquote(scope["path"])
        wire = _wire_of(path, bool(json.loads(body).get("stream")) if path.startswith("/v1/") else False)
        with self.lock:
            answer = self.damaged if wire == self.wire else WIRES[wire][0]
            if wire == self.wire:
                self.sent += 1
        if wire.endswith("-stream"):
            events = answer if isinstance(answer, list) else [answer]
            data = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
            if wire == "openai-stream":
                data += b"data: [DONE]\n\n"
            ctype = b"text/event-stream"
        else:
            data, ctype = json.dumps(answer).encode(), b"application/json"
        headers = [(b"content-type", ctype), (b"content-length", str(len(data)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": data})


@dataclass
class Served:
    url: str
    harness: Harness
    upstream: DamagedUpstream
    session: requests.Session


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, gw_env: None) -> Iterator[Served]:
    upstream = DamagedUpstream()
    root = tmp_path_factory.mktemp("damaged")
    with ThreadedServer(upstream) as up:
        policies = make_policies(root / "policies", up.url)
        team_file = policies / "teams" / "qa.yaml"
        team = yaml.safe_load(team_file.read_text())
        team["flows"].update(FLOWS)
        team_file.write_text(yaml.safe_dump(team))
        state = root / "state"
        state.mkdir()
        # The circuit never opens: an open one would skip the damaged upstream, and an example's
        # outcome would depend on the examples before it.
        harness = build_harness(policies, state, make_keys(state), breaker=BreakerSettings(min_calls=10**9))
        app = create_app(lambda: harness.pipeline)
        with ThreadedServer(app) as gateway, requests.Session() as session:
            yield Served(gateway.url, harness, upstream, session)


def _count(value: Any) -> int | None:
    """`value` as a token count the gateway may read, else None."""
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_CONTEXT_TOKENS:
        return value
    return None


def _stated(
    fresh: Any, completion: Any, read: Any = None, written: Any = None, *, cache_in_prompt: bool
) -> Usage | None:
    """The usage these counts state. OpenAI's prompt count includes its cached tokens;
    Anthropic's and Bedrock's input count leaves out cache reads and writes."""
    f, c = _count(fresh), _count(completion)
    r, w = (0 if n is None else _count(n) for n in (read, written))
    if f is None or c is None or r is None or w is None:
        return None
    prompt = f if cache_in_prompt else f + r + w
    return Usage(prompt, c, min(r, prompt)) if prompt <= MAX_CONTEXT_TOKENS else None


def _stated_usages(wire: str, answer: Any) -> list[Usage]:
    """Every usage the answer states in whole; a reported bill must be one of them."""
    items = answer if isinstance(answer, list) else [answer]
    found: list[Usage | None] = []
    for item in items:
        u = item.get("usage") if isinstance(item, dict) else None
        if not isinstance(u, dict):
            continue
        if wire.startswith("openai"):
            details = u.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if isinstance(details, dict) else None
            found.append(_stated(u.get("prompt_tokens"), u.get("completion_tokens"), cached, cache_in_prompt=True))
        elif wire == "anthropic":
            read, written = u.get("cache_read_input_tokens"), u.get("cache_creation_input_tokens")
            found.append(_stated(u.get("input_tokens"), u.get("output_tokens"), read, written, cache_in_prompt=False))
        elif wire == "bedrock":
            fresh, out, read, written = (
                _as_botocore_reads(u.get(k))
                for k in ("inputTokens", "outputTokens", "cacheReadInputTokens", "cacheWriteInputTokens")
            )
            found.append(_stated(fresh, out, read, written, cache_in_prompt=False))
    if wire == "anthropic-stream":  # input in message_start, output in message_delta
        starts = [
            e["message"].get("usage")
            for e in items
            if _is_event(e, "message_start") and isinstance(e.get("message"), dict)
        ]
        outputs = [
            e["usage"]["output_tokens"]
            for e in items
            if _is_event(e, "message_delta") and isinstance(e.get("usage"), dict) and "output_tokens" in e["usage"]
        ]
        for start in (s for s in starts if isinstance(s, dict)):
            read, written = start.get("cache_read_input_tokens"), start.get("cache_creation_input_tokens")
            found += [_stated(start.get("input_tokens"), o, read, written, cache_in_prompt=False) for o in outputs]
    return [u for u in found if u is not None]


def _as_botocore_reads(value: Any) -> Any:
    """A Bedrock count as botocore hands it over: it reads an integer field with `int()`, so
    `"12"` arrives as 12 and 1.5 as 1 (the gateway never sees what was sent). A value `int()`
    refuses fails botocore's parse: the answer is malformed, with no usage read."""
    if value is None:
        return None
    try:
        return int(value)
    except (TypeError, ValueError, OverflowError):
        return value


def _is_event(event: Any, kind: str) -> bool:
    return isinstance(event, dict) and event.get("type") == kind


def _read_stream(resp: requests.Response, what: str) -> None:
    """The SSE body: chunks of OpenAI's shape, ending in `[DONE]` or an error event."""
    try:
        lines = [line for line in resp.iter_lines(decode_unicode=True) if line.startswith("data:")]
    except requests.exceptions.ChunkedEncodingError as exc:
        raise AssertionError(f"{what}: the stream's connection was dropped ({exc})") from None
    assert lines, f"{what}: an empty stream"
    payloads = [line[5:].strip() for line in lines]
    last = payloads[-1]
    if last != "[DONE]":
        error = json.loads(last).get("error") if last.startswith("{") else None
        assert isinstance(error, dict) and error.get("code"), f"{what}: the stream ended without [DONE]: {last[:300]}"
    for payload in payloads[:-1]:
        chunk = json.loads(payload)
        for choice in chunk.get("choices", []):
            content = choice["delta"].get("content")
            assert content is None or isinstance(content, str), f"{what}: streamed content {content!r}"
            finish = choice.get("finish_reason")
            assert finish is None or _finish_reason(finish), f"{what}: finish reason {finish!r}"


def _read_answer(resp: requests.Response, what: str) -> None:
    if resp.status_code != 200:
        body = resp.json()
        assert set(body) == {"error"} and {"type", "code", "message"} <= set(body["error"]), (
            f"{what}: {resp.status_code} not in OpenAI's error shape: {resp.text[:300]}"
        )
        return
    choice = resp.json()["choices"][0]
    message = choice["message"]
    assert isinstance(message["content"], str) or message.get("tool_calls"), f"{what}: content {message!r:.200}"
    assert _finish_reason(choice["finish_reason"]), f"{what}: finish reason {choice['finish_reason']!r}"


def _finish_reason(value: Any) -> bool:
    return isinstance(value, str) and value in FINISH_REASONS


def _record(served: Served, request_id: str, what: str) -> Exchange:
    deadline = time.monotonic() + 10  # a stream is audited as its body ends
    while True:
        records = [e for e in list(served.harness.audit.exchanges) if e.ctx.request_id == request_id]
        if records or time.monotonic() > deadline:
            break
        time.sleep(0.005)
    assert len(records) == 1, f"{what}: {len(records)} audit records"
    return records[0]


@settings(
    max_examples=EXAMPLES,
    derandomize=DERANDOMIZE,
    deadline=None,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(data=st.data())
def test_a_damaged_answer_is_used_or_failed_as_the_providers_and_billed(served: Served, data: Any) -> None:
    wire = data.draw(st.sampled_from(sorted(WIRES)), label="wire")
    damaged, change = mutate(copy.deepcopy(WIRES[wire][0]), data.draw)
    check_damaged_answer(served, wire, damaged, f"{wire} answer with {change}")


def check_damaged_answer(served: Served, wire: str, damaged: Any, what: str) -> None:
    """Send one request whose `wire` answer is `damaged`; check what the client got, the
    record and the bills."""
    _, model, flow = WIRES[wire]
    up = served.upstream
    with up.lock:
        up.wire, up.damaged, up.sent = wire, damaged, 0
    try:
        resp = served.session.post(
            f"{served.url}/v1/chat/completions",
            json={"model": "auto", "stream": wire.endswith("-stream"), "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {served.harness.keys['qa']}", FLOW_HEADER: flow},
            stream=True,
            timeout=30,
        )
    except requests.ConnectionError as exc:
        raise AssertionError(f"{what}: the gateway closed the connection without an answer ({exc})") from None
    assert resp.status_code != 500, f"{what}: 500 {resp.text[:300]}"
    if resp.status_code == 200 and wire.endswith("-stream"):
        _read_stream(resp, what)
    else:
        _read_answer(resp, what)

    record = _record(served, resp.headers[H_REQUEST_ID], what)
    assert record.error_code != "client_disconnected", f"{what}: recorded as a client that left"
    if not wire.endswith("-stream"):
        assert record.status_code == resp.status_code, (
            f"{what}: recorded {record.status_code}, answered {resp.status_code}"
        )
    bills = [b for b in record.bills if b.model == model]
    assert len(bills) == up.sent, f"{what}: the upstream sent {up.sent} answers, {len(bills)} were billed: {bills}"
    stated = _stated_usages(wire, damaged)
    for b in bills:
        counts = (b.usage.prompt_tokens, b.usage.completion_tokens, b.usage.cached_prompt_tokens)
        assert all(_count(n) is not None for n in counts), f"{what}: billed {b}"
        if b.basis == "reported":
            assert b.usage in stated, f"{what}: billed {b.usage} as reported; the answer stated {stated}"


EMBEDDINGS = {
    "object": "list",
    "model": "text-embedding-3-small",
    "data": [
        {"object": "embedding", "index": 0, "embedding": [0.1, -0.2]},
        {"object": "embedding", "index": 1, "embedding": [0.3, 0.4]},
    ],
    "usage": {"prompt_tokens": 5, "total_tokens": 5},
}


@settings(max_examples=PARSE_EXAMPLES, derandomize=DERANDOMIZE, deadline=None, database=None)
@given(data=st.data())
def test_a_damaged_embeddings_answer_is_refused_or_read_whole(data: Any) -> None:
    """OpenAI's embeddings answer with one thing changed: a billed `server_error`, or vectors
    of finite numbers in input order, a token count the ledger can hold and a model id that
    can go in a header (`NaN` and `Infinity` parse as JSON numbers in Python)."""
    damaged, change = mutate(copy.deepcopy(EMBEDDINGS), data.draw)
    call = EmbeddingCall(model="embed", model_version="asked", inputs=("a", "b"), timeout_s=1.0, request_id="r")
    try:
        answer = parse_embeddings("openai", damaged, call)
    except ProviderError as exc:
        assert exc.error_class is ErrorClass.SERVER_ERROR and exc.billed, f"{change}: {exc.message}"
        return
    assert all(math.isfinite(x) for vector in answer.vectors for x in vector), f"{change}: {answer.vectors}"
    assert len(answer.vectors) == 2, f"{change}: {answer.vectors}"
    assert _count(answer.prompt_tokens) is not None, f"{change}: {answer.prompt_tokens} tokens"
    assert answer.model_version.isprintable() and len(answer.model_version) <= 200, (
        f"{change}: {answer.model_version!r}"
    )


@dataclass
class _Answering:
    """A Serve handle's `chat` method, as `handle.chat.remote(payload)` is awaited."""

    answer: Any

    async def _answer(self, payload: dict[str, Any]) -> Any:
        return self.answer

    def remote(self, payload: dict[str, Any]) -> Any:
        return self._answer(payload)


@dataclass
class _Handle:
    chat: _Answering


@settings(max_examples=PARSE_EXAMPLES, derandomize=DERANDOMIZE, deadline=None, database=None)
@given(data=st.data())
def test_a_damaged_answer_from_a_teams_serve_deployment_is_read_as_strictly(data: Any) -> None:
    """A team's own Serve deployment answers the gateway with an OpenAI chat completion dict.
    One thing changed in it: a billed `server_error`, or a string answer with a finish reason
    of OpenAI's vocabulary, a model id fit for a header, and a usage read only when it is
    whole counts (a negative count was charged as a refund; `"12"` raised out of the chain)."""
    damaged, change = mutate(copy.deepcopy(OPENAI), data.draw)
    provider = ServeHandleProvider("team-llm", _Handle(_Answering(damaged)))  # type: ignore[arg-type]
    call = ProviderCall(
        model="m",
        model_version="asked",
        messages=[{"role": "user", "content": "hi"}],
        max_tokens=8,
        timeout_s=1.0,
        request_id="r",
    )
    try:
        done = asyncio.run(provider.complete(call))
    except ProviderError as exc:
        assert exc.error_class in (ErrorClass.SERVER_ERROR, ErrorClass.CONTENT_FILTER), f"{change}: {exc.message}"
        assert exc.billed or exc.error_class is ErrorClass.CONTENT_FILTER, f"{change}: a 200 not billed"
        return
    assert isinstance(done.text, str) and _finish_reason(done.finish_reason), f"{change}: {done}"
    assert done.model_version.isprintable() and len(done.model_version) <= 200, f"{change}: {done.model_version!r}"
    if done.usage_reported:
        assert done.usage in _stated_usages("openai", damaged), f"{change}: read {done.usage}"


@pytest.mark.parametrize(
    ("sent", "read"),
    [("stop", "stop"), ("length", "length"), ("eos_token", "stop"), ("stop_sequence", "stop"), ("abort", None)],
)
def test_a_finish_reason_is_read_as_openai_names_it(sent: str, read: str | None) -> None:
    """Other OpenAI-compatible servers name the same ends otherwise (TGI: `eos_token`); vLLM's
    `abort` is an answer cut short, so the answer is malformed (billed, and the flow falls back)."""
    answer = copy.deepcopy(OPENAI)
    answer["choices"][0]["finish_reason"] = sent
    if read is None:
        with pytest.raises(ProviderError) as err:
            read_chat_completion("vllm", answer, "asked")
        assert err.value.billed and err.value.error_class is ErrorClass.SERVER_ERROR
    else:
        assert read_chat_completion("vllm", answer, "asked").finish_reason == read
