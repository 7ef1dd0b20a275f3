"""What product code sends beyond plain text — tools, images, structured output — as the gateway
parses, routes and records it. No sockets: parsing, planning, contracts and the stream
assembler are pure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from gw_fakes import PNG_DATA_URL
from gw_harness import Harness

from switchyard.audit.builder import images_by_digest
from switchyard.audit.restore import PlaceholderRestorer
from switchyard.gateway.capabilities import Needs, lacking, needs_of
from switchyard.gateway.contracts import OutputContracts, output_spec
from switchyard.gateway.errors import BadRequest
from switchyard.gateway.messages import map_text, text_chars, texts
from switchyard.gateway.providers.base import ToolCallDelta
from switchyard.gateway.results import NOT_RETRYABLE
from switchyard.gateway.stream_tools import StreamedToolCalls
from switchyard.gateway.wire import parse_chat_request
from switchyard.policy.models import Capabilities, ModelEntry

ASYNC = pytest.mark.asyncio(loop_scope="session")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather for a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
TOOL_TURNS = [
    {"role": "user", "content": "Weather in Paris?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
        ],
        "refusal": None,
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 21}'},
]


def body(**kw: Any) -> bytes:
    return json.dumps({"model": "auto", "messages": [{"role": "user", "content": "hi"}], **kw}).encode()


def refusal(raw: bytes) -> BadRequest:
    with pytest.raises(BadRequest) as err:
        parse_chat_request(raw)
    return err.value


# ---------------------------------------------------------------- the wire format


def test_a_tool_conversation_parses_into_the_gateway_message_shape() -> None:
    req = parse_chat_request(body(messages=TOOL_TURNS, tools=[WEATHER], tool_choice="auto", parallel_tool_calls=False))
    msgs = [m.as_message() for m in req.messages]
    assert msgs[1] == {"role": "assistant", "content": None, "tool_calls": TOOL_TURNS[1]["tool_calls"]}
    assert msgs[2] == {"role": "tool", "content": '{"temp_c": 21}', "tool_call_id": "call_1"}
    assert req.tool_dicts() == (WEATHER,)
    assert req.tool_choice_value() == "auto" and req.parallel_tool_calls is False


@pytest.mark.parametrize(
    ("extra", "param", "words"),
    [
        ({"tools": [{"type": "function", "function": {"name": "has space"}}]}, "tools[0].function.name", "pattern"),
        ({"tools": [WEATHER, WEATHER]}, "tools", "share a name"),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}},
            "tool_choice",
            "not in",
        ),
        ({"tool_choice": "required"}, "tool_choice", "no tools"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0]", "tool_call_id"),
        ({"messages": [{"role": "user", "content": None}]}, "messages[0]", "content is required"),
        ({"functions": [{"name": "f"}]}, "functions", "Extra inputs"),
        ({"response_format": {"type": "json_schema"}}, "response_format", "json_schema"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "http://x/a.png"}}]}
                ]
            },
            "messages[0].content[0].image_url.url",
            "https",
        ),
        (
            {"messages": [{"role": "system", "content": [{"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]}]},
            "messages[0]",
            "user messages",
        ),
    ],
)
def test_bad_tool_image_and_format_fields_are_refused_by_name(
    extra: dict[str, Any], param: str | None, words: str
) -> None:
    err = refusal(body(**extra))
    assert words in err.message
    if param is not None:
        assert err.param == param


def test_the_openai_sdk_echo_of_an_assistant_message_is_accepted() -> None:
    """`messages.append(completion.choices[0].message)` sends back what the gateway answered."""
    echoed = {**TOOL_TURNS[1], "annotations": [], "audio": None, "function_call": None}
    req = parse_chat_request(body(messages=[TOOL_TURNS[0], echoed, TOOL_TURNS[2]], tools=[WEATHER]))
    assert req.messages[1].as_message()["tool_calls"][0]["id"] == "call_1"


# ---------------------------------------------------------------- what a request needs


def entry(**caps: Any) -> ModelEntry:
    return ModelEntry(provider="p", model_version="v", capabilities=Capabilities(**caps), context_window=100)


def test_needs_and_lacks() -> None:
    image = {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://cdn.example/a.png"}}]}
    needs = needs_of([*TOOL_TURNS, image], (), None)
    assert needs.tools and needs.images == 1 and needs.image_urls  # history alone asks for tools
    assert lacking(entry(), needs) == "lacks_tools"
    assert lacking(entry(tools=True), needs) == "lacks_vision"
    assert lacking(entry(tools=True, vision=True), needs) == "lacks_image_urls"
    assert lacking(entry(tools=True, vision=True, image_urls=True), needs) is None
    assert not needs_of([image], (), None, fetch_images=True).image_urls  # the gateway sends bytes
    assert lacking(entry(), Needs(), input_tokens=100) == "context_window"
    assert lacking(entry(), Needs(), input_tokens=99) is None
    assert lacking(entry(), Needs(tools=True, parallel_tool_calls=True)) == "lacks_tools"
    assert lacking(entry(tools=True), Needs(tools=True, parallel_tool_calls=True)) == "lacks_parallel_tool_calls"


def test_text_is_every_string_a_model_reads_and_map_text_rewrites_all_of_it() -> None:
    msgs = [
        *TOOL_TURNS,
        {
            "role": "user",
            "content": [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": PNG_DATA_URL}}],
        },
    ]
    assert [t for m in msgs for t in texts(m)] == [
        "Weather in Paris?",
        "get_weather",
        '{"city":"Paris"}',
        '{"temp_c": 21}',
        "see",
    ]
    shouted = [map_text(m, str.upper) for m in msgs]
    assert shouted[1]["tool_calls"][0]["function"] == {"name": "get_weather", "arguments": '{"CITY":"PARIS"}'}
    assert shouted[1]["tool_calls"][0]["id"] == "call_1"  # identifiers are not text
    assert shouted[3]["content"][1]["image_url"]["url"] == PNG_DATA_URL
    assert msgs[1]["tool_calls"][0]["function"]["arguments"] == '{"city":"Paris"}'  # input untouched
    assert text_chars(msgs) == sum(len(t) for m in msgs for t in texts(m))


# ---------------------------------------------------------------- planning (the harness's policies)


def plan(gw: Harness, flow: str, **kw: Any) -> Any:
    headers = {"authorization": f"Bearer {gw.keys['qa']}", "x-switchyard-flow": flow}
    return gw.pipeline.planner.plan(gw.store.current, body(**kw), headers, "r1", 1.8e9, 0.0)


@ASYNC
async def test_a_candidate_without_tools_is_skipped_with_its_reason(gw: Harness) -> None:
    p = plan(gw, "agent", tools=[WEATHER])
    assert [c.model for c in p.route.candidates] == ["gpt-4o-mini", "claude-haiku"]
    skip = [s for s in p.route.skipped if s.capability]
    assert [(s.model, s.reason) for s in skip] == [("local-gpt", "lacks_tools")]
    # Without tools the same flow keeps the local model in its chain.
    assert [c.model for c in plan(gw, "agent").route.candidates] == ["gpt-4o-mini", "local-gpt", "claude-haiku"]


@ASYNC
async def test_no_capable_candidate_is_a_400_naming_the_feature_and_each_model(gw: Harness) -> None:
    with pytest.raises(BadRequest) as err:
        plan(gw, "local-only", tools=[WEATHER])
    assert err.value.code == "unsupported_feature" and err.value.param == "tools"
    assert "local-gpt: lacks_tools" in err.value.message


@ASYNC
async def test_an_https_image_skips_the_provider_that_takes_bytes_only(gw: Harness) -> None:
    url_image = [
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://cdn.example/a.png"}}]}
    ]
    p = plan(gw, "vision", messages=url_image)
    assert [c.model for c in p.route.candidates] == ["claude-haiku"]
    assert [(s.model, s.reason) for s in p.route.skipped] == [("bedrock-claude-sonnet", "lacks_image_urls")]
    data_image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]}]
    assert plan(gw, "vision", messages=data_image).route.candidates[0].model == "bedrock-claude-sonnet"


@ASYNC
async def test_images_in_a_redacted_data_class_are_refused(gw: Harness) -> None:
    data_image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]}]
    with pytest.raises(BadRequest) as err:
        plan(gw, "private", messages=data_image)
    assert err.value.code == "images_not_allowed" and "'personal'" in err.value.message


@ASYNC
async def test_a_prompt_past_an_exact_context_window_skips_the_model(gw: Harness) -> None:
    """gpt-4o-mini counts o200k exactly; past its window the chain starts at claude-haiku."""
    long = [{"role": "user", "content": "word " * 130_000}]
    p = plan(gw, "plain", messages=long)
    assert [(s.model, s.reason) for s in p.route.skipped if s.capability] == [("gpt-4o-mini", "context_window")]


# ---------------------------------------------------------------- structured output


@ASYNC
async def test_response_format_and_the_flow_schema_combine_by_the_documented_rule(gw: Harness) -> None:
    flow = gw.pipeline.planner.flows.get(gw.store.current, "qa", "strict-json")
    schema = flow.output_schema
    assert plan(gw, "strict-json").output.schema == schema
    assert plan(gw, "strict-json", response_format={"type": "json_object"}).output.schema == schema
    same = {
        "type": "json_schema",
        "json_schema": {"name": "a", "schema": json.loads(json.dumps(schema)), "strict": True},
    }
    assert plan(gw, "strict-json", response_format=same).output.strict
    other = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "array"}}}
    with pytest.raises(BadRequest) as err:
        plan(gw, "strict-json", response_format=other)
    assert err.value.code == "response_format_conflict"
    assert "response_format.json_schema" in err.value.message and "output_schema" in err.value.message
    # Without a flow schema the request's own contract applies.
    assert plan(gw, "plain", response_format={"type": "json_object"}).output.schema == {"type": "object"}
    assert plan(gw, "plain", response_format=other).output.schema == {"type": "array"}
    assert plan(gw, "plain").output is None
    bad = {"type": "json_schema", "json_schema": {"name": "a", "schema": {"type": "no-such-type"}}}
    with pytest.raises(BadRequest) as bad_err:
        plan(gw, "plain", response_format=bad)
    assert bad_err.value.param == "response_format.json_schema.schema"


def test_contracts_check_the_spec_and_keep_a_bounded_cache() -> None:
    contracts = OutputContracts(max_schemas=2)
    flowless = type("F", (), {"output_schema": None, "team": "t", "flow": "f"})()
    fmt = type("RF", (), {"type": "json_object", "json_schema": None})()
    spec = output_spec(flowless, fmt)  # type: ignore[arg-type]
    assert contracts.problem(spec, '{"a": 1}') is None
    assert contracts.problem(spec, "[1]") == "at (root): fails `type`"
    assert contracts.problem(spec, "not json") == "the answer is not JSON"
    for i in range(5):
        array = type("S", (), {"name": "n", "json_schema": {"type": "array", "maxItems": i}, "strict": None})()
        s = output_spec(flowless, type("RF", (), {"type": "json_schema", "json_schema": array})())  # type: ignore[arg-type]
        contracts.problem(s, "[]")
    assert len(contracts._validators) == 2


# ---------------------------------------------------------------- streamed tool calls, audit, retries


def test_streamed_tool_arguments_are_restored_across_fragments() -> None:
    calls = StreamedToolCalls(lambda: PlaceholderRestorer({"<EMAIL_ADDRESS_1>": "ann@example.com"}))
    out = calls.feed((ToolCallDelta(0, "call_1", "send_mail", '{"to": "<EMAIL_'),))
    out += calls.feed((ToolCallDelta(0, arguments='ADDRESS_1>"}'),))
    out += calls.flush()
    sent = "".join(d.arguments for d in out)
    assert sent == '{"to": "ann@example.com"}'
    assert out[0].id == "call_1" and out[0].name == "send_mail"
    (whole,) = calls.calls()
    assert (whole.id, whole.name, whole.arguments) == ("call_1", "send_mail", sent)
    assert "<EMAIL_ADDRESS_1>" in calls.raw_text()  # what the provider billed: its own bytes


def test_images_are_recorded_by_digest_not_bytes() -> None:
    msg = {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": PNG_DATA_URL}},
        ],
    }
    stored = images_by_digest(msg)
    url = stored["content"][1]["image_url"]["url"]
    assert url.startswith("data:image/png;base64,<sha256:") and "iVBOR" not in url
    assert stored["content"][0] == msg["content"][0] and msg["content"][1]["image_url"]["url"] == PNG_DATA_URL


def test_answers_a_retry_cannot_fix_say_so() -> None:
    assert {400, 402, 409, 502} <= NOT_RETRYABLE and not {408, 429, 500, 503, 504} & NOT_RETRYABLE


def test_policies_dir_declares_capabilities(repo: Path) -> None:
    from switchyard.policy.loader import load_policy_set

    ps = load_policy_set(repo / "policies")
    assert ps.providers.models["gpt-4o-mini"].capabilities.tools
    assert not ps.providers.models["local-gpt"].capabilities.tools


@ASYNC
async def test_tool_definitions_are_reserved_and_a_request_contract_reserves_a_repair(gw: Harness) -> None:
    from switchyard.gateway.billing import chain_bound

    ps = gw.store.current
    plain, tooled = plan(gw, "agent"), plan(gw, "agent", tools=[WEATHER] * 1)
    day = plain.ctx.day
    without = chain_bound(ps.providers, tooled.route.candidates, tooled.messages, 64, False, day)
    with_tools = chain_bound(ps.providers, tooled.route.candidates, tooled.messages, 64, False, day, tooled.tools)
    assert with_tools.input_tokens > without.input_tokens and with_tools.usd > without.usd
    assert plain.tools == () and tooled.tools == (WEATHER,)


@ASYNC
async def test_a_request_contract_holds_its_repair_turn(gw: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `response_format` answer may be repaired once, so the hold covers the repair turn, as a
    flow schema's does."""
    held: list[float] = []
    real = gw.budget.reserve

    async def spy(ctx: Any, estimate: Any) -> Any:
        held.append(estimate.usd)
        return await real(ctx, estimate)

    monkeypatch.setattr(gw.budget, "reserve", spy)
    headers = {"authorization": f"Bearer {gw.keys['qa']}", "x-switchyard-flow": "plain"}
    await gw.pipeline.handle(body(), headers)
    await gw.pipeline.handle(body(response_format={"type": "json_object"}), headers)
    assert held[1] > held[0] * 1.5  # the repair turn re-sends input and answer, and may answer again


@ASYNC
async def test_sampling_fields_a_model_does_not_take_skip_it_visibly(gw: Harness) -> None:
    """Anthropic's pinned API has no temperature, Bedrock's Converse stops at 1: those models are
    skipped (never sent the request with the field dropped or capped)."""
    p = plan(gw, "plain", temperature=0.3)
    assert [(s.model, s.reason) for s in p.route.skipped] == [("claude-haiku", "lacks_temperature")]
    with pytest.raises(BadRequest) as err:
        plan(gw, "vision", temperature=1.5)
    assert err.value.param == "temperature" and err.value.code == "unsupported_feature"
    assert "bedrock-claude-sonnet: temperature_above_max; claude-haiku: lacks_temperature" in err.value.message
