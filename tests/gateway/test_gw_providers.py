"""Each provider adapter against its fake upstream: the wire format is accepted by a server
that validates it with the official SDK's request types, and every fault maps to its class."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
from gw_fakes import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstreams, Fault, Upstream

from switchyard.gateway.providers.anthropic_messages import AnthropicProvider
from switchyard.gateway.providers.base import ChatProvider, ProviderCall, ProviderError
from switchyard.gateway.providers.bedrock_converse import BedrockProvider
from switchyard.gateway.providers.openai_compat import OpenAICompatProvider
from switchyard.gateway.providers.registry import build_provider
from switchyard.policy.models import Credential, ErrorClass, Provider, ProviderKind

pytestmark = pytest.mark.asyncio(loop_scope="session")


CALL = ProviderCall(
    model="m",
    model_version="model-v1",
    timeout_s=2.0,
    request_id="r1",
    max_tokens=32,
    stop=["END"],
    messages=[
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "user", "content": "again"},
        {"role": "assistant", "content": "hi"},
        {"role": "user", "content": "bye"},
    ],
)


@pytest.fixture
async def provider(
    request: pytest.FixtureRequest, upstreams: FakeUpstreams, gw_env: None
) -> AsyncIterator[tuple[ChatProvider, Upstream]]:
    upstreams.reset()
    kind = request.param
    p: ChatProvider
    if kind == "openai":
        p, up = OpenAICompatProvider("openai", f"{upstreams.base}/v1", OPENAI_KEY), upstreams.openai
    elif kind == "anthropic":
        p, up = AnthropicProvider("anthropic", upstreams.base, ANTHROPIC_KEY), upstreams.anthropic
    else:
        p, up = BedrockProvider("bedrock", "us-east-1", upstreams.base, 2.0), upstreams.bedrock
    yield p, up
    await p.aclose()


ALL = pytest.mark.parametrize("provider", ["openai", "anthropic", "bedrock"], indirect=True)


async def collect(p: ChatProvider, call: ProviderCall = CALL) -> tuple[str, str | None]:
    text, finish = "", None
    async for d in p.stream(call):
        text += d.text
        finish = d.finish_reason or finish
    return text, finish


@ALL
async def test_complete_and_stream(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.reply = "a reply long enough to arrive in several chunks"
    # The pinned Messages API has no sampling fields (the catalog says so; see the next test).
    call = CALL if p.name == "anthropic" else replace(CALL, temperature=0.2)
    done = await p.complete(call)
    assert done.text == up.reply and done.usage.prompt_tokens > 0 and done.finish_reason == "stop"
    assert await collect(p, call) == (up.reply, "stop")
    assert not up.rejected, up.rejected
    assert len(up.received) == 2
    if p.name != "anthropic":
        sent = up.received[-1]
        assert 0.2 in (sent.get("temperature"), sent.get("inferenceConfig", {}).get("temperature"))


@pytest.mark.parametrize("provider", ["anthropic", "bedrock"], indirect=True)  # OpenAI takes them all
async def test_a_sampling_field_a_provider_lacks_is_refused_by_name_not_dropped(
    provider: tuple[ChatProvider, Upstream],
) -> None:
    p, up = provider
    field, value = ("temperature", 0.2) if p.name == "anthropic" else ("temperature", 1.5)
    with pytest.raises(ProviderError) as err:
        await p.complete(replace(CALL, **{field: value}))
    assert err.value.error_class is ErrorClass.BAD_REQUEST and f"cannot honour {field}" in err.value.message
    assert not up.received


@ALL
@pytest.mark.parametrize(
    ("fault", "error_class"),
    [
        (Fault("status", status=500), ErrorClass.SERVER_ERROR),
        (Fault("status", status=503), ErrorClass.SERVER_ERROR),
        (Fault("reset"), ErrorClass.CONNECTION),
        (Fault("malformed"), ErrorClass.SERVER_ERROR),
        (Fault("latency", delay_s=0.5), ErrorClass.TIMEOUT),
    ],
)
async def test_faults_map_to_error_classes(
    provider: tuple[ChatProvider, Upstream], fault: Fault, error_class: ErrorClass
) -> None:
    p, up = provider
    up.faults.append(fault)
    call = ProviderCall(**{**CALL.__dict__, "timeout_s": 0.2})
    with pytest.raises(ProviderError) as err:
        await p.complete(call)
    if isinstance(p, BedrockProvider) and fault.kind == "reset":
        # botocore reads a truncated body without raising; it surfaces as a malformed answer.
        error_class = ErrorClass.SERVER_ERROR
    assert err.value.error_class is error_class
    assert "hello" not in err.value.message and OPENAI_KEY not in err.value.message
    if fault.kind == "latency":
        # The request was sent whole: the provider may bill the answer nobody reads.
        assert err.value.billed


@ALL
async def test_429_carries_retry_after(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.faults.append(Fault("status", status=429, retry_after="7"))
    with pytest.raises(ProviderError) as err:
        await p.complete(CALL)
    assert err.value.error_class is ErrorClass.RATE_LIMITED
    if not isinstance(p, BedrockProvider):  # Bedrock sends no Retry-After
        assert err.value.retry_after_s == 7.0


@pytest.mark.parametrize("provider", ["openai", "anthropic"], indirect=True)
async def test_stream_that_dies_midway(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.reply = "x" * 64
    up.faults.append(Fault("die_midway"))
    got = ""
    with pytest.raises(ProviderError) as err:
        async for d in p.stream(CALL):
            got += d.text
    assert err.value.error_class is ErrorClass.CONNECTION
    assert 0 < len(got) < 64


@pytest.mark.parametrize("provider", ["openai"], indirect=True)
async def test_context_length_and_bad_request(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.faults.append(Fault("status", status=400, error_type="context_length_exceeded"))
    with pytest.raises(ProviderError) as err:
        await p.complete(CALL)
    assert err.value.error_class is ErrorClass.CONTEXT_LENGTH
    up.faults.append(Fault("status", status=400, error_type="invalid_request_error"))
    with pytest.raises(ProviderError) as err:
        await p.complete(CALL)
    assert err.value.error_class is ErrorClass.BAD_REQUEST


async def test_fake_rejects_a_wrongly_shaped_request(upstreams: FakeUpstreams) -> None:
    """The validation is real: an Anthropic request with two user turns in a row is refused."""
    upstreams.reset()
    import httpx

    async with httpx.AsyncClient() as c:
        resp = await c.post(
            f"{upstreams.base}/v1/messages",
            headers={"x-api-key": ANTHROPIC_KEY, "anthropic-version": "2023-06-01"},
            json={
                "model": "m",
                "max_tokens": 5,
                "messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
            },
        )
        assert resp.status_code == 400
        resp = await c.post(
            f"{upstreams.base}/v1/chat/completions",
            headers={"authorization": f"Bearer {OPENAI_KEY}"},
            json={"model": "m", "messages": [{"role": "user", "content": "a"}], "max_tokens": "many"},
        )
        assert resp.status_code == 400
        resp = await c.post(
            f"{upstreams.base}/v1/chat/completions",
            headers={"authorization": f"Bearer {OPENAI_KEY}"},
            json={"model": "m", "messages": [{"role": "user", "content": "a"}], "bogus_field": 1},
        )
        assert resp.status_code == 400


async def test_missing_credential_is_a_connection_error_naming_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    spec = Provider(
        kind=ProviderKind.OPENAI, base_url="http://127.0.0.1:9", credential=Credential(env="NO_SUCH_KEY_VAR")
    )
    p = build_provider("openai", spec, None)
    with pytest.raises(ProviderError) as err:
        await p.complete(CALL)
    assert err.value.error_class is ErrorClass.CONNECTION and "NO_SUCH_KEY_VAR" in err.value.message


async def test_secret_file_credential(tmp_path: object, upstreams: FakeUpstreams) -> None:
    from pathlib import Path

    secret = Path(str(tmp_path)) / "key"
    secret.write_text(OPENAI_KEY + "\n")
    upstreams.reset()
    spec = Provider(kind=ProviderKind.OPENAI, base_url=f"{upstreams.base}/v1", credential=Credential(file=str(secret)))
    p = build_provider("openai", spec, None)
    assert (await p.complete(CALL)).text == upstreams.openai.reply
    await p.aclose()


def default_workers() -> int:
    return min(32, (os.cpu_count() or 1) + 4)  # asyncio's default executor (`ThreadPoolExecutor`'s size)


async def test_bedrock_calls_take_no_default_worker_and_are_billed_only_when_sent(
    upstreams: FakeUpstreams, gw_env: None
) -> None:
    """Stop 49: boto3 blocks, and Bedrock's calls ran on the event loop's default workers: six
    on a 2-CPU replica. More concurrent calls than that waited for a thread while their timeout
    ran, and each that timed out was charged at the bound, sent or not; and while the calls held
    the workers, nothing else in the replica got one (every request's audit record may be built
    there). Now the provider has threads of its own, and a call withdrawn before a thread took
    it is not billed."""
    upstreams.reset()
    upstreams.bedrock.sticky = Fault("latency", delay_s=3.0)  # every call outlives its timeout
    calls = default_workers() + 4
    wide = BedrockProvider("bedrock", "us-east-1", upstreams.base, 10.0)
    narrow: BedrockProvider | None = None
    try:
        running = [asyncio.ensure_future(wide.complete(replace(CALL, timeout_s=1.5))) for _ in range(calls)]
        await asyncio.sleep(0.5)
        started = time.monotonic()
        await asyncio.wait_for(asyncio.to_thread(lambda: None), timeout=5)
        assert time.monotonic() - started < 0.5  # a default worker was free all along
        outcomes = await asyncio.gather(*running, return_exceptions=True)
        assert all(isinstance(o, ProviderError) and o.error_class is ErrorClass.TIMEOUT for o in outcomes), outcomes
        assert len(upstreams.bedrock.received) == calls  # every call was sent, none waited for a thread
        assert sum(isinstance(o, ProviderError) and o.billed for o in outcomes) == calls
        # Two threads, four calls: two are sent (and billed at the bound), two withdrawn unsent.
        upstreams.reset()
        upstreams.bedrock.sticky = Fault("latency", delay_s=3.0)
        narrow = BedrockProvider("bedrock", "us-east-1", upstreams.base, 10.0, max_calls=2)
        outcomes = await asyncio.gather(
            *(narrow.complete(replace(CALL, timeout_s=1.5)) for _ in range(4)), return_exceptions=True
        )
        assert len(upstreams.bedrock.received) == 2
        assert sorted(isinstance(o, ProviderError) and o.billed for o in outcomes) == [False, False, True, True]
    finally:
        upstreams.bedrock.sticky = None
        await wide.aclose()
        if narrow is not None:
            await narrow.aclose()
