"""End to end through the OpenAI SDK: chat, streaming, headers, and every error status."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import openai
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness

from switchyard.gateway.providers.base import Delta
from switchyard.gateway.seams import OverBudget, RateLimited

pytestmark = pytest.mark.asyncio(loop_scope="session")


SECRET = "my-secret-prompt-text-4711"


async def test_chat_answers_with_provenance_headers(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = "Your parcel is on its way."
    client = gw.client("support")
    raw = await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "Where is my parcel?"}],
        extra_body={"variables": {"product": "Acme Router", "language": "German"}},
    )
    done = raw.parse()
    assert done.choices[0].message.content == "Your parcel is on its way."
    assert done.usage is not None and done.usage.total_tokens == 18
    h = raw.headers
    assert h["x-switchyard-provider"] == "openai"
    assert h["x-switchyard-model"] == "gpt-4o-mini-2024-07-18" or h["x-switchyard-model"] == "gpt-4o-mini"
    assert h["x-switchyard-prompt-version"].startswith("support-reply@2#")
    assert h["x-switchyard-fallback"] == "none"
    assert len(h["x-switchyard-request-id"]) == 32
    sent = upstreams.openai.received[-1]
    assert sent["messages"][0]["role"] == "system" and "German" in sent["messages"][0]["content"]
    assert sent["messages"][1] == {"role": "user", "content": "Where is my parcel?"}
    exchange = gw.audit.exchanges[-1]
    assert exchange.ctx.prompt_ref == h["x-switchyard-prompt-version"] and exchange.provider == "openai"
    assert gw.budget.settled and gw.budget.settled[-1][1] > 0


async def test_default_flow_and_other_prompt_version(gw: Harness, upstreams: FakeUpstreams) -> None:
    client = gw.client("support")
    raw = await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[{"role": "user", "content": "hi"}],
        extra_body={"variables": {"product": "X"}, "prompt_version": 1},
    )
    assert raw.headers["x-switchyard-prompt-version"].startswith("support-reply@1#")


async def test_streaming(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = "streamed answer in several pieces"
    client = gw.client("qa")
    stream = await client.chat.completions.create(
        model="auto",
        messages=[{"role": "user", "content": "hi"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
        usage = chunk.usage or usage
    assert text == "streamed answer in several pieces"
    assert usage is not None and usage.completion_tokens == 7
    assert gw.audit.exchanges[-1].output_text == text


async def test_models_lists_what_the_team_may_use(gw: Harness) -> None:
    models = await gw.client("support").models.list()
    ids = {m.id for m in models.data}
    assert {"auto", "gpt-4o-mini", "claude-haiku"} <= ids and "gpt-4o" not in ids


async def test_openapi_is_served(gw: Harness) -> None:
    resp = await gw.raw().get("/openapi.json")
    assert resp.status_code == 200 and "/v1/chat/completions" in resp.json()["paths"]


async def test_400_malformed_never_echoes_content(gw: Harness) -> None:
    client = gw.client("qa")
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(model="auto", messages=[{"role": "robot", "content": SECRET}])  # type: ignore[misc,list-item]
    assert SECRET not in json.dumps(err.value.body)
    assert err.value.response.headers["x-switchyard-request-id"]
    resp = await gw.raw().post(
        "/v1/chat/completions",
        content=b"{not json" + SECRET.encode(),
        headers={"authorization": f"Bearer {gw.keys['qa']}"},
    )
    assert resp.status_code == 400 and SECRET not in resp.text
    assert resp.json()["error"]["code"] == "invalid_json"


async def test_400_variables_against_input_schema(gw: Harness) -> None:
    client = gw.client("support")
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="auto", messages=[], extra_body={"variables": {"product": SECRET * 10}}
        )
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "invalid_variables" and SECRET not in json.dumps(body)
    with pytest.raises(openai.BadRequestError):
        await client.chat.completions.create(model="auto", messages=[], extra_body={"variables": {}})


async def test_400_free_messages_on_closed_flow(gw: Harness) -> None:
    client = gw.client("qa")
    with pytest.raises(openai.BadRequestError) as err:
        await client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Switchyard-Flow": "closed"}
        )
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "free_messages_forbidden"


async def test_401_unknown_and_revoked_keys(gw: Harness) -> None:
    for key in ("sy_nope_nope", gw.keys["revoked"], "garbage"):
        client = gw.client("qa")
        client.api_key = key
        with pytest.raises(openai.AuthenticationError):
            await client.chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])


async def test_403_model_flow_role_and_prompt_version(gw: Harness) -> None:
    client = gw.client("support")
    with pytest.raises(openai.PermissionDeniedError) as err:
        await client.chat.completions.create(model="gpt-4o", messages=[], extra_body={"variables": {"product": "X"}})
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "model_not_allowed"
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(
            model="auto", messages=[], extra_headers={"X-Switchyard-Flow": "dispute-review"}
        )
    with pytest.raises(openai.PermissionDeniedError):
        await client.chat.completions.create(
            model="auto", messages=[], extra_body={"variables": {"product": "X"}, "prompt_version": 3}
        )
    with pytest.raises(openai.PermissionDeniedError):
        await gw.client("auditor").chat.completions.create(model="auto", messages=[])


async def test_402_over_budget(gw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    async def refuse(ctx: object, estimate: object) -> object:
        raise OverBudget("team:qa:day", 10.0, 10.0, "2026-12-01T00:00:00Z")

    monkeypatch.setattr(gw.budget, "reserve", refuse)
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client("qa").chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 402
    assert gw.audit.exchanges[-1].budget_decision == "over_budget:team:qa:day"


async def test_429_rate_limited_with_retry_after(gw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    async def limited(ctx: object, estimate: object) -> object:
        raise RateLimited("team:qa:rpm", 2.5)

    monkeypatch.setattr(gw.budget, "reserve", limited)
    with pytest.raises(openai.RateLimitError) as err:
        await gw.client("qa").chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert err.value.response.headers["retry-after"] == "3"


async def test_502_and_503_provider_failures(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await gw.client("qa").chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 502
    upstreams.openai.sticky = Fault("reset")
    upstreams.anthropic.sticky = Fault("reset")
    with pytest.raises(openai.InternalServerError) as err:
        await gw.client("qa").chat.completions.create(model="auto", messages=[{"role": "user", "content": "x"}])
    assert err.value.status_code == 503


async def test_504_deadline(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("latency", delay_s=1.0)
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client("qa").chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Switchyard-Deadline-Ms": "200"}
        )
    assert err.value.status_code == 504
    assert "gpt-4o-mini (timeout)" in err.value.message


async def test_a_provider_bug_is_a_500_in_openai_shape_and_holds_no_money(
    gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    import httpx
    from gw_harness import build_harness

    from switchyard.gateway.http import create_app
    from switchyard.gateway.providers.base import Completion, ProviderCall
    from switchyard.gateway.providers.inprocess import InProcessProvider

    async def broken(call: ProviderCall) -> Completion:
        raise RuntimeError("a bug in an adapter")

    policies, state, keys = gw_dirs
    h = build_harness(policies, state, keys, overrides={"openai": InProcessProvider("openai", broken)})  # type: ignore[arg-type]
    transport = httpx.ASGITransport(app=create_app(lambda: h.pipeline), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": "auto", "messages": [{"role": "user", "content": SECRET}]},
            headers={"authorization": f"Bearer {keys['qa']}"},
        )
    assert resp.status_code == 500 and resp.json()["error"]["code"] == "internal_error"
    assert SECRET not in resp.text and not h.budget.held
    await h.aclose()


class _BuggyStream:
    """A provider whose stream raises what no adapter should: at once, or after its first piece."""

    def __init__(self, after_first: bool) -> None:
        self.name = "openai"
        self.after_first = after_first

    async def complete(self, call: object) -> object:
        raise RuntimeError("a bug in an adapter")

    async def stream(self, call: object) -> AsyncIterator[Delta]:
        if self.after_first:
            yield Delta(text="partial ")
        raise RuntimeError("a bug in an adapter")

    async def aclose(self) -> None:
        return None


@pytest.mark.parametrize("how", ["complete", "stream before its first piece", "stream after its first piece"])
async def test_a_provider_bug_is_recorded_as_the_gateways_500_not_as_a_client_that_left(
    gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams, how: str
) -> None:
    """The record said `client_disconnected` (499) for a bug, and mid-stream the client's
    connection was dropped without a word. Now the record is the 500 the client gets, with the
    request's id in its headers, and a stream that breaks after its first byte ends with an
    `internal_error` event."""
    import httpx
    from gw_harness import build_harness

    from switchyard.gateway.http import create_app

    policies, state, keys = gw_dirs
    provider = _BuggyStream(after_first=how.endswith("after its first piece"))
    h = build_harness(policies, state, keys, overrides={"openai": provider})  # type: ignore[dict-item]
    transport = httpx.ASGITransport(app=create_app(lambda: h.pipeline), raise_app_exceptions=False)
    async with httpx.AsyncClient(transport=transport, base_url="http://gateway") as http:
        resp = await http.post(
            "/v1/chat/completions",
            json={"model": "auto", "stream": how != "complete", "messages": [{"role": "user", "content": "hi"}]},
            headers={"authorization": f"Bearer {keys['qa']}", "x-switchyard-flow": "plain"},
        )
    for _ in range(200):  # a stream is audited as its body ends; this harness audits nothing else
        records = list(h.audit.exchanges)
        if records:
            break
        await asyncio.sleep(0.01)
    assert [(r.status_code, r.error_code) for r in records] == [(500, "internal_error")]
    assert resp.headers["x-request-id"] == records[0].ctx.request_id  # the id to quote to the platform team
    if how.endswith("after its first piece"):
        assert resp.status_code == 200
        last = [line for line in resp.text.splitlines() if line.startswith("data:")][-1]
        assert json.loads(last[5:])["error"]["code"] == "internal_error"
    else:
        assert resp.status_code == 500 and resp.json()["error"]["code"] == "internal_error"
    assert not h.budget.held
    await h.aclose()
