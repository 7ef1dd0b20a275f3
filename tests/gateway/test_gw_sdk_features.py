"""What product teams' code sends, through the unchanged official `openai` SDK: tool-calling
loops (plain and streamed, assembled by the SDK's stream helper), `parse` with a pydantic
model, images, fallback in the middle of a tool conversation, and the headers SDKs rely on.
The fake upstreams validate what they receive with each provider's own SDK types."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import openai
import pytest
from gw_fakes import PNG_DATA_URL, FakeUpstreams, Fault
from gw_harness import Harness
from pydantic import BaseModel

from switchyard.gateway.seams import OverBudget

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
AGENT = {"X-Switchyard-Flow": "agent"}


def tool_result(call: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call.id, "content": json.dumps(result)}


async def test_two_turn_tool_loop(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.faults.append(Fault("tool_calls", calls=[("get_weather", {"city": "Paris"})]))
    upstreams.openai.reply = "It is 21 °C in Paris."
    client = gw.client("qa")
    raw = await client.chat.completions.with_raw_response.create(
        model="auto", messages=ASK, tools=[WEATHER], tool_choice="auto", extra_headers=AGENT
    )
    first = raw.parse()
    assert first.choices[0].finish_reason == "tool_calls"
    (call,) = first.choices[0].message.tool_calls or []
    assert call.type == "function" and call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Paris"}
    # The local model cannot call tools: skipped, and said so, though the primary answered.
    assert raw.headers["x-switchyard-fallback"] == "local-gpt:lacks_tools"
    assert gw.metrics.skips[("local", "lacks_tools")] == 1
    assert gw.audit.exchanges[-1].skipped == (("local-gpt", "lacks_tools"),)
    assert gw.audit.exchanges[-1].output_tool_calls[0]["function"]["name"] == "get_weather"
    sent = upstreams.openai.received[-1]
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == "auto"

    # Turn two: the SDK's own message object goes back as history, with the tool's result.
    messages: list[Any] = [*ASK, first.choices[0].message, tool_result(call, {"temp_c": 21})]
    second = await client.chat.completions.create(model="auto", messages=messages, tools=[WEATHER], extra_headers=AGENT)
    assert second.choices[0].message.content == "It is 21 °C in Paris."
    history = upstreams.openai.received[-1]["messages"]
    assert history[-2]["tool_calls"][0]["id"] == call.id
    assert history[-1] == {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}


async def test_streamed_tool_call_assembled_by_the_sdk_stream_helper(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.faults.append(
        Fault("tool_calls", calls=[("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Lyon"})])
    )
    client = gw.client("qa")
    async with client.chat.completions.stream(
        model="auto", messages=ASK, tools=[WEATHER], extra_headers=AGENT, stream_options={"include_usage": True}
    ) as stream:
        async for _ in stream:
            pass
        final = await stream.get_final_completion()
    calls = final.choices[0].message.tool_calls or []
    assert [json.loads(c.function.arguments) for c in calls] == [{"city": "Paris"}, {"city": "Lyon"}]
    assert final.choices[0].finish_reason == "tool_calls"
    # The final usage chunk carries what the stream cost (headers left before it was known).
    assert final.usage is not None
    extra = final.usage.model_extra or {}
    assert extra["switchyard"]["cost_usd"] > 0
    audited = gw.audit.exchanges[-1]
    assert [c["function"]["arguments"] for c in audited.output_tool_calls] == [c.function.arguments for c in calls]
    assert abs(audited.cost_usd - extra["switchyard"]["cost_usd"]) < 1e-8


async def test_fallback_mid_conversation_keeps_tool_semantics(gw: Harness, upstreams: FakeUpstreams) -> None:
    """Turn one from OpenAI; turn two's OpenAI attempt fails, and Anthropic gets the call and
    its result as `tool_use` / `tool_result` blocks its own SDK's types accept."""
    upstreams.openai.faults.append(Fault("tool_calls", calls=[("get_weather", {"city": "Paris"})]))
    client = gw.client("qa")
    first = await client.chat.completions.create(model="auto", messages=ASK, tools=[WEATHER], extra_headers=AGENT)
    call = (first.choices[0].message.tool_calls or [])[0]
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.reply = "Paris: 21 °C, sunny."
    raw = await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[*ASK, first.choices[0].message, tool_result(call, {"temp_c": 21})],
        tools=[WEATHER],
        extra_headers=AGENT,
    )
    assert raw.parse().choices[0].message.content == "Paris: 21 °C, sunny."
    assert raw.headers["x-switchyard-provider"] == "anthropic"
    assert raw.headers["x-switchyard-fallback"] == "local-gpt:lacks_tools,gpt-4o-mini:server_error"
    sent = upstreams.anthropic.received[-1]
    assert sent["tools"][0]["name"] == "get_weather" and "input_schema" in sent["tools"][0]
    use = [b for b in sent["messages"][1]["content"] if b["type"] == "tool_use"]
    result = [b for b in sent["messages"][2]["content"] if b["type"] == "tool_result"]
    assert use[0]["id"] == call.id and use[0]["input"] == {"city": "Paris"}
    assert result[0]["tool_use_id"] == call.id
    assert not upstreams.anthropic.rejected


async def test_a_tool_request_the_flow_cannot_serve_is_a_400_naming_tools(gw: Harness) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await gw.client("qa").chat.completions.create(
            model="auto", messages=ASK, tools=[WEATHER], extra_headers={"X-Switchyard-Flow": "local-only"}
        )
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "unsupported_feature"
    assert err.value.body["param"] == "tools" and "local-gpt: lacks_tools" in err.value.body["message"]
    assert err.value.response.headers["x-should-retry"] == "false"


class Weather(BaseModel):
    city: str
    temp_c: float


async def test_parse_with_a_pydantic_model_natively_and_through_the_contract(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    upstreams.openai.reply = '{"city": "Paris", "temp_c": 21}'
    client = gw.client("qa")
    done = await client.chat.completions.parse(model="auto", messages=ASK, response_format=Weather)
    assert done.choices[0].message.parsed == Weather(city="Paris", temp_c=21)
    fmt = upstreams.openai.received[-1]["response_format"]
    assert fmt["type"] == "json_schema" and fmt["json_schema"]["strict"] is True  # native at OpenAI
    # Anthropic has no native structured output here: the gateway checks and repairs.
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.faults.append(Fault("reply", text="Sure! It is warm."))
    upstreams.anthropic.reply = '{"city": "Paris", "temp_c": 21.5}'
    fell_back = await client.chat.completions.parse(model="auto", messages=ASK, response_format=Weather)
    assert fell_back.choices[0].message.parsed == Weather(city="Paris", temp_c=21.5)
    assert len(upstreams.anthropic.received) == 2  # the answer, then one repair
    assert gw.audit.exchanges[-1].contract_result == "valid"


async def test_images_reach_vision_models_in_their_own_shape(gw: Harness, upstreams: FakeUpstreams) -> None:
    client = gw.client("qa")
    vision = {"X-Switchyard-Flow": "vision"}
    data_msg: Any = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {"type": "image_url", "image_url": {"url": PNG_DATA_URL}},
            ],
        }
    ]
    raw = await client.chat.completions.with_raw_response.create(model="auto", messages=data_msg, extra_headers=vision)
    assert raw.headers["x-switchyard-provider"] == "bedrock"
    blocks = upstreams.bedrock.received[-1]["messages"][0]["content"]
    assert any("image" in b and b["image"]["format"] == "png" for b in blocks)
    url_msg: Any = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://cdn.example/a.png"}}]}
    ]
    raw = await client.chat.completions.with_raw_response.create(model="auto", messages=url_msg, extra_headers=vision)
    assert raw.headers["x-switchyard-provider"] == "anthropic"
    assert raw.headers["x-switchyard-fallback"] == "bedrock-claude-sonnet:lacks_image_urls"
    image = upstreams.anthropic.received[-1]["messages"][0]["content"][0]
    assert image == {"type": "image", "source": {"type": "url", "url": "https://cdn.example/a.png"}}


async def test_headers_sdks_rely_on(gw: Harness, upstreams: FakeUpstreams) -> None:
    client = gw.client("qa")
    done = await client.chat.completions.with_raw_response.create(model="auto", messages=ASK)
    assert done.headers["x-request-id"] == done.headers["x-switchyard-request-id"]
    assert done.parse()._request_id == done.headers["x-request-id"]
    assert float(done.headers["x-switchyard-cost-usd"]) == pytest.approx(gw.audit.exchanges[-1].cost_usd, abs=1e-8)
    assert "x-switchyard-budget-remaining-usd" not in done.headers  # qa/plain has no budget of its own
    budgeted = await client.chat.completions.with_raw_response.create(model="auto", messages=ASK, extra_headers=AGENT)
    spent = sum(e.cost_usd for e in gw.audit.exchanges if e.ctx.flow.flow == "agent")
    left = float(budgeted.headers["x-switchyard-budget-remaining-usd"])
    assert left == pytest.approx(gw.budget.limits[next(iter(gw.budget.limits))] - spent, abs=1e-7)
    # A 409 is not retried by the SDK: the same key with another body will never succeed.
    key = {"Idempotency-Key": "k-sdk-1"}
    await client.chat.completions.create(model="auto", messages=ASK, extra_headers=key)
    with pytest.raises(openai.ConflictError) as conflict:
        await client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "x"}], extra_headers=key
        )
    assert conflict.value.response.headers["x-should-retry"] == "false"


async def test_the_sdk_does_not_rerun_an_exhausted_chain(gw: Harness, upstreams: FakeUpstreams) -> None:
    """With its default two retries the SDK would run a failed chain three times over."""
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.sticky = Fault("status", status=500)
    client = gw.client("qa").with_options(max_retries=2)
    with pytest.raises(openai.APIStatusError) as err:
        await client.chat.completions.create(model="auto", messages=ASK)
    assert err.value.status_code == 502 and err.value.response.headers["x-should-retry"] == "false"
    # One chain: a try and a retry per candidate. Without the header it would be three chains.
    assert len(upstreams.openai.received) == 2 and len(upstreams.anthropic.received) == 2
    assert sum(1 for e in gw.audit.exchanges if e.status_code == 502) == 1


async def test_over_budget_is_not_retried(
    gw: Harness, upstreams: FakeUpstreams, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def refuse(*args: object) -> None:
        raise OverBudget("team:qa:day", 10.0, 10.0, "00:00 UTC")

    monkeypatch.setattr(gw.budget, "reserve", refuse)
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client("qa").with_options(max_retries=2).chat.completions.create(model="auto", messages=ASK)
    assert err.value.status_code == 402 and err.value.response.headers["x-should-retry"] == "false"


async def test_the_readme_example_is_accepted(gw: Harness, upstreams: FakeUpstreams, repo: Path) -> None:
    """The call in README.md, as written there, against the team it names."""
    block = re.search(r"```python\n(.*?)```", (repo / "README.md").read_text(), re.S)
    assert block is not None
    call = next(
        n
        for n in ast.walk(ast.parse(block.group(1)))
        if isinstance(n, ast.Call) and ast.unparse(n.func) == "client.chat.completions.create"
    )
    kwargs = {k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg is not None}
    done = await gw.client("support").chat.completions.create(**kwargs)
    assert done.choices[0].message.content


async def test_the_trace_of_a_fallback_shows_both_attempts(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    from gw_harness import build_harness
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from switchyard.gateway.tracing import GatewayTracing

    upstreams.reset()
    exporter = InMemorySpanExporter()
    policies, state, keys = gw_dirs
    traced = build_harness(policies, state, keys, tracing=GatewayTracing(exporter))
    try:
        upstreams.openai.sticky = Fault("status", status=500)
        upstreams.anthropic.reply = "from claude"
        await traced.client("qa").chat.completions.create(model="auto", messages=ASK)
        stream = await traced.client("qa").chat.completions.create(model="auto", messages=ASK, stream=True)
        async for _ in stream:
            pass
        await traced.pipeline.drain()
    finally:
        await traced.aclose()
    spans = exporter.get_finished_spans()
    requests = [s for s in spans if s.name == "chat auto"]
    assert len(requests) == 2
    first = requests[0]
    children = [s for s in spans if s.parent is not None and s.parent.span_id == first.context.span_id]
    attempts = [s for s in children if s.kind.name == "CLIENT"]
    assert [s.attributes["switchyard.provider"] for s in attempts] == ["openai", "openai", "anthropic"]
    assert [s.attributes.get("error.type") for s in attempts] == ["server_error", "server_error", None]
    assert attempts[-1].attributes["gen_ai.usage.output_tokens"] > 0
    assert {"redaction", "budget.reserve", "budget.settle", "audit.record"} <= {s.name for s in children}
    assert first.attributes["http.response.status_code"] == 200
    # The streamed request's span ends after its last byte, its children inside it.
    streamed = requests[1]
    inner = [s for s in spans if s.parent is not None and s.parent.span_id == streamed.context.span_id]
    assert inner and all(s.end_time <= streamed.end_time for s in inner)
    for s in spans:  # identifiers, names and counts only: never content
        assert "What is the weather" not in str(dict(s.attributes or {})) and "from claude" not in str(
            dict(s.attributes or {})
        )
