"""The HTTP adapters' transport (`upstream_http`, aiohttp) against real sockets: each way an
upstream can fail maps to the error class, and the billing, that retries, circuits and
fallback rules read; a request cancelled or a stream abandoned midway gives its connection
back (a pool of one would otherwise be stuck) and never hands a half-read one to the next."""

from __future__ import annotations

import asyncio
import json
import socket
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
from gw_fakes import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstreams, Fault
from gw_server import ThreadedServer, request_body

from switchyard.gateway.contracts import OutputContracts, OutputSpec
from switchyard.gateway.providers.anthropic_messages import AnthropicProvider
from switchyard.gateway.providers.base import EmbeddingCall, ProviderCall, ProviderError
from switchyard.gateway.providers.openai_compat import OpenAICompatProvider
from switchyard.gateway.providers.openai_embeddings import OpenAIEmbeddingsProvider
from switchyard.gateway.providers.openai_format import tool_arguments
from switchyard.gateway.providers.upstream_http import env_proxy
from switchyard.policy.models import ErrorClass

pytestmark = pytest.mark.asyncio(loop_scope="session")

CALL = ProviderCall(
    model="m",
    model_version="model-v1",
    timeout_s=2.0,
    request_id="r1",
    max_tokens=32,
    messages=[{"role": "user", "content": "hello"}],
)


@pytest.fixture
async def openai(upstreams: FakeUpstreams, gw_env: None) -> AsyncIterator[OpenAICompatProvider]:
    upstreams.reset()
    p = OpenAICompatProvider("openai", f"{upstreams.base}/v1", OPENAI_KEY, max_connections=1)
    yield p
    await p.aclose()


@pytest.fixture
def silent_listener() -> Iterator[str]:
    """A port that accepts connections (the kernel's backlog) and never answers."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    sock.close()


def closed_port() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}"  # nothing listens there now: connections are refused


async def failure(call: object) -> ProviderError:
    with pytest.raises(ProviderError) as err:
        await call  # type: ignore[misc]
    return err.value


async def stream_failure(p: OpenAICompatProvider | AnthropicProvider, call: ProviderCall) -> tuple[str, ProviderError]:
    got = ""
    with pytest.raises(ProviderError) as err:
        async for d in p.stream(call):
            got += d.text
    return got, err.value


async def test_a_refused_connection_is_a_connection_error_not_billed() -> None:
    p = OpenAICompatProvider("openai", closed_port(), OPENAI_KEY)
    err = await failure(p.complete(CALL))
    assert err.error_class is ErrorClass.CONNECTION and not err.billed
    _, err = await stream_failure(p, CALL)
    assert err.error_class is ErrorClass.CONNECTION and not err.billed
    await p.aclose()


async def test_an_upstream_that_accepts_and_hangs_is_a_billed_timeout(silent_listener: str) -> None:
    p = OpenAICompatProvider("openai", silent_listener, OPENAI_KEY)
    started = asyncio.get_running_loop().time()
    err = await failure(p.complete(replace(CALL, timeout_s=0.2)))
    # Connected and sent whole, then nothing: the provider may be working on it (and bill it).
    assert err.error_class is ErrorClass.TIMEOUT and err.billed
    assert asyncio.get_running_loop().time() - started < 1.5
    await p.aclose()


async def test_a_slow_answer_times_out_billed_and_the_pool_recovers(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.faults.append(Fault("latency", delay_s=0.6))
    err = await failure(openai.complete(replace(CALL, timeout_s=0.2)))
    assert err.error_class is ErrorClass.TIMEOUT and err.billed
    assert (await openai.complete(CALL)).text == upstreams.openai.reply  # the one connection is free again


async def test_waiting_for_a_free_connection_past_the_timeout_is_an_unbilled_timeout(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.faults.append(Fault("latency", delay_s=0.6))
    busy = asyncio.create_task(openai.complete(CALL))  # holds the pool's only connection
    await asyncio.sleep(0.1)
    err = await failure(openai.complete(replace(CALL, timeout_s=0.2)))
    assert err.error_class is ErrorClass.TIMEOUT and not err.billed  # nothing was sent
    assert (await busy).text == upstreams.openai.reply


async def test_a_close_mid_body_after_200_is_a_billed_connection_error(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    """The 200 says the provider made the answer, so it may bill it: billed at the bound
    (it was not, and a retry made the provider bill a second answer the ledger never saw)."""
    upstreams.openai.faults.append(Fault("reset"))  # 200, Content-Length 500, then the connection drops
    err = await failure(openai.complete(CALL))
    assert err.error_class is ErrorClass.CONNECTION and err.billed
    assert (await openai.complete(CALL)).text == upstreams.openai.reply


@pytest.mark.parametrize(("status", "error_class"), [(500, ErrorClass.SERVER_ERROR), (504, ErrorClass.TIMEOUT)])
async def test_a_5xx_is_classified_by_its_status(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams, status: int, error_class: ErrorClass
) -> None:
    upstreams.openai.faults.append(Fault("status", status=status))
    err = await failure(openai.complete(CALL))
    assert (err.error_class, err.status, err.billed) == (error_class, status, False)
    upstreams.openai.faults.append(Fault("status", status=status))
    _, err = await stream_failure(openai, CALL)
    assert (err.error_class, err.status) == (error_class, status)


async def test_a_429_carries_its_retry_after_streaming_or_not(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.faults.append(Fault("status", status=429, retry_after="3"))
    err = await failure(openai.complete(CALL))
    assert (err.error_class, err.retry_after_s) == (ErrorClass.RATE_LIMITED, 3.0)
    upstreams.openai.faults.append(Fault("status", status=429, retry_after="4"))
    _, err = await stream_failure(openai, CALL)
    assert (err.error_class, err.retry_after_s) == (ErrorClass.RATE_LIMITED, 4.0)


async def test_a_stream_arrives_whole_in_order(openai: OpenAICompatProvider, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = "a reply long enough to arrive in several chunks, ünïcode included"
    pieces = [d async for d in openai.stream(CALL)]
    assert "".join(d.text for d in pieces) == upstreams.openai.reply
    assert len([d for d in pieces if d.text]) > 1
    assert pieces[-1].finish_reason == "stop" and pieces[-1].usage is not None


async def test_a_stream_that_stalls_midway_is_a_billed_timeout(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.reply = "x" * 64
    upstreams.openai.faults.append(Fault("stall_midway", delay_s=0.8))
    got, err = await stream_failure(openai, replace(CALL, timeout_s=0.2))
    assert err.error_class is ErrorClass.TIMEOUT and err.billed
    assert 0 < len(got) < 64
    await asyncio.sleep(0.7)  # the fake finishes its stalled answer before the next test


async def test_a_stream_that_dies_midway_is_a_connection_error(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.reply = "x" * 64
    upstreams.openai.faults.append(Fault("die_midway"))
    got, err = await stream_failure(openai, CALL)
    assert err.error_class is ErrorClass.CONNECTION and 0 < len(got) < 64
    assert (await openai.complete(CALL)).text == upstreams.openai.reply


async def test_a_cancelled_request_gives_its_connection_back(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    """The client hung up while the upstream was answering: the attempt is cancelled."""
    upstreams.openai.faults.append(Fault("latency", delay_s=0.5))
    task = asyncio.create_task(openai.complete(CALL))
    await asyncio.sleep(0.1)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # One connection in the pool: a leaked one would make this wait, then time out.
    assert (await openai.complete(replace(CALL, timeout_s=1.0))).text == upstreams.openai.reply


async def test_an_abandoned_stream_is_not_reused_half_read(
    openai: OpenAICompatProvider, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.reply = "y" * 200
    stream = openai.stream(CALL)
    first = await anext(stream)
    assert first.text
    await stream.aclose()  # the gateway's client went away mid-stream
    upstreams.openai.reply = "the next answer, whole"
    assert (await openai.complete(replace(CALL, timeout_s=1.0))).text == "the next answer, whole"
    assert [d.text async for d in openai.stream(CALL) if d.text] != []


async def test_the_anthropic_adapter_classifies_the_same_way(upstreams: FakeUpstreams, gw_env: None) -> None:
    upstreams.reset()
    p = AnthropicProvider("anthropic", upstreams.base, ANTHROPIC_KEY, max_connections=1)
    upstreams.anthropic.faults.append(Fault("reset"))
    assert (await failure(p.complete(CALL))).error_class is ErrorClass.CONNECTION
    upstreams.anthropic.faults.append(Fault("latency", delay_s=0.5))
    err = await failure(p.complete(replace(CALL, timeout_s=0.2)))
    assert err.error_class is ErrorClass.TIMEOUT and err.billed
    upstreams.anthropic.faults.append(Fault("status", status=429, retry_after="2"))
    _, err = await stream_failure(p, CALL)
    assert (err.error_class, err.retry_after_s) == (ErrorClass.RATE_LIMITED, 2.0)
    assert (await p.complete(replace(CALL, timeout_s=1.0))).text == upstreams.anthropic.reply
    await p.aclose()


async def test_embeddings_share_the_transport_and_its_classes(silent_listener: str) -> None:
    call = EmbeddingCall(model="e", model_version="e-v1", inputs=("a",), timeout_s=0.2, request_id="r1")
    hanging = OpenAIEmbeddingsProvider("emb", silent_listener, OPENAI_KEY)
    err = await failure(hanging.embed(call))
    assert err.error_class is ErrorClass.TIMEOUT and err.billed
    await hanging.aclose()
    refused = OpenAIEmbeddingsProvider("emb", closed_port(), OPENAI_KEY)
    err = await failure(refused.embed(call))
    assert err.error_class is ErrorClass.CONNECTION and not err.billed
    await refused.aclose()


@pytest.mark.parametrize(
    ("env", "url", "proxy"),
    [
        ({}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": "proxy.corp:3128"}, "https://api.openai.com/v1", "http://proxy.corp:3128"),
        ({"HTTPS_PROXY": "http://p:1"}, "http://10.0.0.5:8000/v1", None),  # an http upstream: HTTP_PROXY's
        ({"ALL_PROXY": "http://p:1"}, "http://10.0.0.5:8000/v1", "http://p:1"),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "openai.com"}, "https://api.openai.com/v1", None),
        ({"HTTPS_PROXY": "http://p:1", "NO_PROXY": "*"}, "https://api.openai.com/v1", None),
    ],
)
async def test_the_proxy_comes_from_the_environment_as_httpx_took_it(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], url: str, proxy: str | None
) -> None:
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
        monkeypatch.delenv(name.lower(), raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert env_proxy(url) == proxy


async def test_requests_go_through_the_proxy_the_environment_names(
    monkeypatch: pytest.MonkeyPatch, upstreams: FakeUpstreams, gw_env: None
) -> None:
    """A forward proxy sees absolute-form requests: the fake answers them like any other."""
    upstreams.reset()
    monkeypatch.setenv("HTTP_PROXY", upstreams.base)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    p = OpenAICompatProvider("openai", "http://upstream.invalid/v1", OPENAI_KEY)  # resolvable only by the proxy
    assert (await p.complete(CALL)).text == upstreams.openai.reply
    await p.aclose()


async def _one_long_event(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An OpenAI stream whose whole 1 MB answer is one event (one SSE line)."""
    await request_body(receive)
    event = {"choices": [{"index": 0, "delta": {"content": "x" * 1_000_000}, "finish_reason": "stop"}]}
    body = b"data: " + json.dumps(event).encode() + b"\n\ndata: [DONE]\n\n"
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
    await send({"type": "http.response.body", "body": body})


async def test_a_stream_line_longer_than_the_reader_takes_is_a_billed_server_error() -> None:
    """aiohttp's `LineTooLong` escaped the adapter, so the request ended as the gateway's 500."""
    with ThreadedServer(_one_long_event) as server:
        p = OpenAICompatProvider("openai", f"{server.url}/v1", OPENAI_KEY)
        try:
            _, err = await stream_failure(p, CALL)
        finally:
            await p.aclose()
    assert (err.error_class, err.billed) == (ErrorClass.SERVER_ERROR, True), err.message


async def _endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An upstream that answers 200 and sends 64 KiB pieces until the client goes: a JSON body
    that never closes, or stream events without end."""
    streamed = json.loads(await request_body(receive)).get("stream")
    piece = b'data: {"choices": [{"index": 0, "delta": {"content": "' + b"x" * 65_000 + b'"}}]}\n\n'
    start = {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
    await send(start)
    if not streamed:
        await send({"type": "http.response.body", "body": b'{"choices": [{"message": {"content": "', "more_body": True})
        piece = b"x" * 65_536
    for _ in range(10_000):  # 640 MB at most, should the client never stop reading
        await send({"type": "http.response.body", "body": piece, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


@pytest.mark.parametrize("streamed", [False, True])
async def test_an_upstream_that_does_not_stop_is_cut_off_billed_not_read_into_memory(streamed: bool) -> None:
    """Both answers were read whole, without a bound: an upstream that did not stop filled the
    replica's memory. Now an answer is at most 1 KiB a token of `max_tokens` and 1 MiB besides."""
    with ThreadedServer(_endless) as server:
        p = OpenAICompatProvider("openai", f"{server.url}/v1", OPENAI_KEY)
        try:
            if streamed:
                _, err = await stream_failure(p, CALL)
            else:
                err = await failure(p.complete(CALL))
        finally:
            await p.aclose()
    assert (err.error_class, err.billed) == (ErrorClass.SERVER_ERROR, True), err.message
    assert f"longer than {2**20 + 2**10 * CALL.max_tokens:,} bytes" in err.message


DEEP = b"[" * 100_000 + b"]" * 100_000  # deeper than Python's JSON parser goes: it raises RecursionError


async def _deep_json(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """Every answer nested 100,000 levels deep: the body, each stream event, or a 429's body."""
    streamed = json.loads(await request_body(receive)).get("stream")
    status = 429 if scope["path"].startswith("/refused/") else 200
    body = b"data: " + DEEP + b"\n\n" if streamed and status == 200 else DEEP
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body})


@pytest.mark.parametrize("how", ["answer", "stream event", "error body"])
async def test_json_nested_deeper_than_the_parser_goes_is_a_provider_error(how: str) -> None:
    """`RecursionError` is no `ValueError`: it escaped every parse of an upstream's JSON as the
    gateway's 500. Now the answer is malformed (a billed `server_error`); an error body just
    says nothing more than its status."""
    with ThreadedServer(_deep_json) as server:
        base = f"{server.url}/refused/v1" if how == "error body" else f"{server.url}/v1"
        p = OpenAICompatProvider("openai", base, OPENAI_KEY)
        try:
            if how == "stream event":
                _, err = await stream_failure(p, CALL)
            else:
                err = await failure(p.complete(CALL))
        finally:
            await p.aclose()
    if how == "error body":
        assert (err.error_class, err.status) == (ErrorClass.RATE_LIMITED, 429), err.message
    else:
        assert (err.error_class, err.billed) == (ErrorClass.SERVER_ERROR, True), err.message


async def test_tool_call_arguments_nested_too_deeply_are_refused_by_name() -> None:
    """A client's past tool call whose arguments nest 100,000 levels: the Anthropic and
    Bedrock translations parse them, and `RecursionError` made the request the gateway's 500."""
    with pytest.raises(ProviderError) as err:
        tool_arguments("anthropic", "messages[1].tool_calls[0].function.arguments", DEEP.decode())
    assert err.value.error_class is ErrorClass.BAD_REQUEST
    assert "messages[1].tool_calls[0].function.arguments" in err.value.message


async def test_a_model_answer_nested_too_deeply_breaks_the_contract_rather_than_the_gateway() -> None:
    recursive = {"type": "array", "items": {"$ref": "#"}}
    contracts = OutputContracts()
    assert (
        contracts.problem(OutputSpec({"type": "object"}), DEEP.decode()) == "the answer nests JSON too deeply to read"
    )
    assert (
        contracts.problem(OutputSpec(recursive), "[" * 900 + "]" * 900) == "the answer nests JSON too deeply to check"
    )


@dataclass
class _Elsewhere:
    """A server on another host name that records every request it gets."""

    received: list[dict[str, str]] = field(default_factory=list)

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await request_body(receive)
        self.received.append({k.decode(): v.decode() for k, v in scope["headers"]})
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": b"{}"})


def _redirecting_to(target: str, status: int) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        await request_body(receive)
        location = (target + scope["path"]).encode()
        await send({"type": "http.response.start", "status": status, "headers": [(b"location", location)]})
        await send({"type": "http.response.body", "body": b""})

    return app


@pytest.mark.parametrize("status", [302, 307, 308])
@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_redirect_is_never_followed_so_neither_prompt_nor_key_leaves_for_another_host(
    kind: str, status: int
) -> None:
    """aiohttp follows redirects unless told not to (httpx, before it, did not), and keeps
    custom headers across hosts: a redirecting upstream got the prompt sent to any host it
    named, and Anthropic's `x-api-key` with it. A redirect is now the upstream's failure
    (`server_error`, so the flow falls back), not a `bad_request` blamed on the client."""
    elsewhere = _Elsewhere()
    with ThreadedServer(elsewhere) as other:
        target = other.url.replace("127.0.0.1", "localhost")  # another host name, the same machine
        with ThreadedServer(_redirecting_to(target, status)) as upstream:
            p: OpenAICompatProvider | AnthropicProvider
            if kind == "openai":
                p = OpenAICompatProvider("openai", f"{upstream.url}/v1", OPENAI_KEY)
            else:
                p = AnthropicProvider("anthropic", upstream.url, ANTHROPIC_KEY)
            try:
                err = await failure(p.complete(CALL))
            finally:
                await p.aclose()
    assert elsewhere.received == [], f"the request went to {target}"
    assert (err.error_class, err.status, err.billed) == (ErrorClass.SERVER_ERROR, status, False), err.message
