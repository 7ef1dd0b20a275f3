"""Tools, images and structured output through each provider adapter, against fake upstreams
that validate every request with the official SDK's types (or botocore's service model) and
the rules those types cannot state. No pipeline, no Ray."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from gw_fakes import ANTHROPIC_KEY, OPENAI_KEY, FakeUpstreams, Fault, Upstream

from switchyard.cluster.serve_handle import local_chat_request
from switchyard.gateway.providers.anthropic_messages import AnthropicProvider
from switchyard.gateway.providers.base import ChatProvider, OutputFormat, ProviderCall, ProviderError, ToolCall
from switchyard.gateway.providers.bedrock_converse import BedrockProvider
from switchyard.gateway.providers.openai_compat import OpenAICompatProvider
from switchyard.policy.models import ErrorClass

pytestmark = pytest.mark.asyncio(loop_scope="session")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CLOCK = {"type": "function", "function": {"name": "get_time"}}  # no parameters: a call without arguments
PNG_B64 = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
VERDICT = {
    "type": "object",
    "properties": {"ok": {"type": "boolean"}},
    "required": ["ok"],
    "additionalProperties": False,
}
SCRIPTED = [("get_weather", {"city": "Paris", "days": 3}), ("get_time", {})]

HISTORY: list[dict[str, Any]] = [
    {"role": "system", "content": "be brief"},
    {"role": "user", "content": "weather in Paris, and the time?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
            {"id": "call_b", "type": "function", "function": {"name": "get_time", "arguments": "{}"}},
        ],
    },
    {"role": "tool", "tool_call_id": "call_a", "content": "sunny, 21C"},
    {"role": "tool", "tool_call_id": "call_b", "content": [{"type": "text", "text": "14:05"}]},
    {"role": "user", "content": "and tomorrow?"},
]


def make_call(messages: list[dict[str, Any]] | None = None, **fields: Any) -> ProviderCall:
    base: dict[str, Any] = {
        "model": "m",
        "model_version": "model-v1",
        "timeout_s": 2.0,
        "request_id": "r1",
        "max_tokens": 64,
        "messages": messages or [{"role": "user", "content": "weather in Paris?"}],
    }
    return ProviderCall(**{**base, **fields})


@pytest.fixture
async def provider(
    request: pytest.FixtureRequest, upstreams: FakeUpstreams, gw_env: None
) -> AsyncIterator[tuple[ChatProvider, Upstream]]:
    upstreams.reset()
    p: ChatProvider
    if request.param == "openai":
        p, up = OpenAICompatProvider("openai", f"{upstreams.base}/v1", OPENAI_KEY), upstreams.openai
    elif request.param == "anthropic":
        p, up = AnthropicProvider("anthropic", upstreams.base, ANTHROPIC_KEY), upstreams.anthropic
    else:
        p, up = BedrockProvider("bedrock", "us-east-1", upstreams.base, 2.0), upstreams.bedrock
    yield p, up
    await p.aclose()


ALL = pytest.mark.parametrize("provider", ["openai", "anthropic", "bedrock"], indirect=True)
TRANSLATING = pytest.mark.parametrize("provider", ["anthropic", "bedrock"], indirect=True)


async def collect(p: ChatProvider, call: ProviderCall) -> tuple[str, list[ToolCall], str | None]:
    """The streamed answer assembled as a client would: the first piece of each call names it."""
    text, finish = "", None
    calls: dict[int, dict[str, str]] = {}
    async for d in p.stream(call):
        text += d.text
        finish = d.finish_reason or finish
        for piece in d.tool_calls:
            if piece.index not in calls:
                assert piece.id and piece.name, "the first piece of a call carries its id and name"
                calls[piece.index] = {"id": piece.id, "name": piece.name, "arguments": ""}
            calls[piece.index]["arguments"] += piece.arguments
    return text, [ToolCall(**calls[i]) for i in sorted(calls)], finish


def as_scripted(calls: tuple[ToolCall, ...] | list[ToolCall]) -> list[tuple[str, dict[str, Any]]]:
    return [(c.name, json.loads(c.arguments)) for c in calls]


@ALL
async def test_a_tool_calling_answer_complete_and_streamed(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.faults.extend([Fault("tool_calls", calls=SCRIPTED), Fault("tool_calls", calls=SCRIPTED)])
    call = make_call(tools=(WEATHER, CLOCK))
    done = await p.complete(call)
    assert done.finish_reason == "tool_calls" and done.text == ""
    assert as_scripted(done.tool_calls) == SCRIPTED and len({c.id for c in done.tool_calls}) == 2
    text, calls, finish = await collect(p, call)
    assert (text, as_scripted(calls), finish) == ("", SCRIPTED, "tool_calls")
    assert not up.rejected, up.rejected


@ALL
async def test_text_before_the_tool_calls_is_kept(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    up.faults.extend([Fault("tool_calls", text="Let me check.", calls=SCRIPTED[:1])] * 2)
    call = make_call(tools=(WEATHER,))
    done = await p.complete(call)
    assert done.text == "Let me check." and as_scripted(done.tool_calls) == SCRIPTED[:1]
    text, calls, _ = await collect(p, call)
    assert text == "Let me check." and as_scripted(calls) == SCRIPTED[:1]


@ALL
async def test_the_second_turn_with_tool_history_is_accepted(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    done = await p.complete(make_call(HISTORY, tools=(WEATHER, CLOCK)))
    assert done.text == up.reply and not up.rejected, up.rejected
    sent = up.received[-1]["messages"]
    if isinstance(p, AnthropicProvider):
        assert [t["role"] for t in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"][0] == {
            "type": "tool_use",
            "id": "call_a",
            "name": "get_weather",
            "input": {"city": "Paris"},
        }
        results, text = sent[2]["content"][:2], sent[2]["content"][2]
        assert results == [
            {"type": "tool_result", "tool_use_id": "call_a", "content": "sunny, 21C"},
            {"type": "tool_result", "tool_use_id": "call_b", "content": "14:05"},
        ]
        assert text == {"type": "text", "text": "and tomorrow?"}
        assert up.received[-1]["system"] == "be brief"
    elif isinstance(p, BedrockProvider):
        assert [t["role"] for t in sent] == ["user", "assistant", "user"]
        assert sent[1]["content"][1] == {"toolUse": {"toolUseId": "call_b", "name": "get_time", "input": {}}}
        assert sent[2]["content"][0] == {"toolResult": {"toolUseId": "call_a", "content": [{"text": "sunny, 21C"}]}}
        assert sent[2]["content"][2] == {"text": "and tomorrow?"}
    else:
        assert sent == HISTORY  # sent as the client wrote it


@TRANSLATING
async def test_the_fake_refuses_an_unanswered_tool_call(provider: tuple[ChatProvider, Upstream]) -> None:
    """The pairing rule is checked for real: a history whose tool call has no result is a 400."""
    p, up = provider
    unanswered = [m for m in HISTORY if m["role"] != "tool"]
    with pytest.raises(ProviderError) as err:
        await p.complete(make_call(unanswered, tools=(WEATHER, CLOCK)))
    assert err.value.error_class is ErrorClass.BAD_REQUEST and up.rejected


@ALL
async def test_an_image_data_url_is_accepted(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    image = {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG_B64}", "detail": "low"}}
    messages = [{"role": "user", "content": [{"type": "text", "text": "what is this?"}, image]}]
    assert (await p.complete(make_call(messages))).text == up.reply
    assert not up.rejected, up.rejected
    part = up.received[-1]["messages"][0]["content"][1]
    if isinstance(p, AnthropicProvider):
        assert part == {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG_B64}}
    elif isinstance(p, BedrockProvider):
        assert part["image"]["format"] == "png"
        assert base64.b64decode(part["image"]["source"]["bytes"]) == base64.b64decode(PNG_B64)
    else:
        assert part == image


@TRANSLATING
async def test_an_https_image_url(provider: tuple[ChatProvider, Upstream]) -> None:
    """Anthropic takes it as a url source; Bedrock takes bytes only and is refused, by name."""
    p, up = provider
    url = "https://images.example.com/cat.png"
    messages = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "a cat?"}, {"type": "image_url", "image_url": {"url": url}}],
        }
    ]
    if isinstance(p, AnthropicProvider):
        await p.complete(make_call(messages))
        assert up.received[-1]["messages"][0]["content"][1] == {"type": "image", "source": {"type": "url", "url": url}}
        return
    with pytest.raises(ProviderError) as err:
        await p.complete(make_call(messages))
    assert err.value.error_class is ErrorClass.BAD_REQUEST
    assert "messages[0].content[1].image_url.url" in err.value.message and "example.com" not in err.value.message
    assert not up.received


@TRANSLATING
@pytest.mark.parametrize(
    "url",
    ["data:image/bmp;base64,Qk0=", "data:image/png,rawbytes", "data:image/png;base64,!!not-base64!!"],
)
async def test_an_image_that_cannot_be_sent_is_refused(provider: tuple[ChatProvider, Upstream], url: str) -> None:
    p, up = provider
    messages = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]
    with pytest.raises(ProviderError) as err:
        await p.complete(make_call(messages))
    assert (
        err.value.error_class is ErrorClass.BAD_REQUEST and "messages[0].content[0].image_url.url" in err.value.message
    )
    assert not up.received


@pytest.mark.parametrize("provider", ["openai"], indirect=True)
async def test_openai_gets_everything_as_sent_and_json_schema_natively(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    native = OutputFormat(schema=VERDICT, name="verdict", strict=True, native=True)
    choice = {"type": "function", "function": {"name": "get_weather"}}
    await p.complete(make_call(output=native, tools=(WEATHER,), tool_choice=choice, parallel_tool_calls=False))
    sent = up.received[-1]
    assert sent["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "verdict", "schema": VERDICT, "strict": True},
    }
    assert sent["tools"] == [WEATHER] and sent["tool_choice"] == choice and sent["parallel_tool_calls"] is False
    await p.complete(make_call(output=OutputFormat(schema=VERDICT)))  # not native: the contract checks
    assert up.received[-1]["response_format"] == {"type": "json_object"}
    assert "tools" not in up.received[-1] and "parallel_tool_calls" not in up.received[-1]
    assert not up.rejected, up.rejected


@TRANSLATING
async def test_json_output_is_asked_for_in_the_system_prompt(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "ok?"}]
    await p.complete(make_call(messages, output=OutputFormat(schema=VERDICT)))
    system = up.received[-1]["system"]
    text = system if isinstance(system, str) else "\n\n".join(b["text"] for b in system)
    assert text.startswith("be brief") and "JSON" in text and json.dumps(VERDICT, sort_keys=True) in text
    await p.complete(make_call(messages, output=OutputFormat()))  # any JSON object
    assert "JSON object" in json.dumps(up.received[-1]["system"])


@TRANSLATING
async def test_a_native_json_schema_uses_the_providers_own_field(provider: tuple[ChatProvider, Upstream]) -> None:
    """The pinned SDK (`output_config.format`) and botocore (`outputConfig.textFormat`) both
    carry a JSON schema, so a call that asks natively gets it natively (and no instruction)."""
    p, up = provider
    await p.complete(make_call(output=OutputFormat(schema=VERDICT, native=True)))
    sent = up.received[-1]
    assert not up.rejected, up.rejected
    assert "system" not in sent
    if isinstance(p, AnthropicProvider):
        assert sent["output_config"] == {"format": {"type": "json_schema", "schema": VERDICT}}
    else:
        schema = sent["outputConfig"]["textFormat"]["structure"]["jsonSchema"]
        assert json.loads(schema["schema"]) == VERDICT


@TRANSLATING
async def test_unparsable_tool_arguments_are_refused_by_name(provider: tuple[ChatProvider, Upstream]) -> None:
    p, up = provider
    broken = [dict(m) for m in HISTORY]
    broken[2] = {
        **HISTORY[2],
        "tool_calls": [
            {"id": "call_a", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": Par'}}
        ],
    }
    with pytest.raises(ProviderError) as err:
        await p.complete(make_call(broken, tools=(WEATHER,)))
    assert err.value.error_class is ErrorClass.BAD_REQUEST
    assert "messages[2].tool_calls[0].function.arguments" in err.value.message and "Par" not in err.value.message
    assert not up.received


@pytest.mark.parametrize("provider", ["anthropic"], indirect=True)
@pytest.mark.parametrize(
    ("choice", "parallel", "expected"),
    [
        (None, None, {"type": "auto"}),
        ("auto", False, {"type": "auto", "disable_parallel_tool_use": True}),
        ("required", None, {"type": "any"}),
        ("none", False, {"type": "none"}),
        ({"type": "function", "function": {"name": "get_weather"}}, None, {"type": "tool", "name": "get_weather"}),
    ],
)
async def test_anthropic_tool_choice(
    provider: tuple[ChatProvider, Upstream], choice: Any, parallel: bool | None, expected: dict[str, Any]
) -> None:
    p, up = provider
    await p.complete(make_call(tools=(WEATHER,), tool_choice=choice, parallel_tool_calls=parallel))
    sent = up.received[-1]
    assert not up.rejected, up.rejected
    assert sent["tool_choice"] == expected
    assert sent["tools"] == [
        {
            "name": "get_weather",
            "input_schema": WEATHER["function"]["parameters"],
            "description": "The weather in a city",
        }
    ]


@pytest.mark.parametrize("provider", ["bedrock"], indirect=True)
@pytest.mark.parametrize(
    ("choice", "expected"),
    [
        (None, None),
        ("required", {"any": {}}),
        ({"type": "function", "function": {"name": "get_weather"}}, {"tool": {"name": "get_weather"}}),
    ],
)
async def test_bedrock_tool_choice(provider: tuple[ChatProvider, Upstream], choice: Any, expected: Any) -> None:
    p, up = provider
    await p.complete(make_call(tools=(WEATHER, CLOCK), tool_choice=choice))
    config = up.received[-1]["toolConfig"]
    assert config.get("toolChoice") == expected
    assert config["tools"][1] == {
        "toolSpec": {"name": "get_time", "inputSchema": {"json": {"type": "object", "properties": {}}}}
    }


@pytest.mark.parametrize("provider", ["bedrock"], indirect=True)
async def test_bedrock_none_leaves_the_tools_out_until_the_history_uses_them(
    provider: tuple[ChatProvider, Upstream],
) -> None:
    p, up = provider
    await p.complete(make_call(tools=(WEATHER,), tool_choice="none"))
    assert "toolConfig" not in up.received[-1]
    for fields, named in [
        ({"messages": HISTORY, "tools": (WEATHER, CLOCK), "tool_choice": "none"}, "tool_choice"),
        ({"messages": HISTORY}, "tools"),  # a tool history without tools: Converse would refuse it
        ({"tools": (WEATHER,), "parallel_tool_calls": False}, "parallel_tool_calls"),
    ]:
        with pytest.raises(ProviderError) as err:
            await p.complete(make_call(**fields))
        assert err.value.error_class is ErrorClass.BAD_REQUEST and f"cannot honour {named}" in err.value.message
    assert len(up.received) == 1


@TRANSLATING
@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": ({"type": "custom", "custom": {"name": "grep"}},)}, "tools[0]"),
        ({"tools": (WEATHER,), "tool_choice": {"type": "allowed_tools"}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": [{"role": "developer", "content": "hi"}]}, "messages[0].role"),
        (
            {"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {}}]}]},
            "messages[0].content[0]",
        ),
    ],
)
async def test_what_cannot_be_translated_is_refused_by_name(
    provider: tuple[ChatProvider, Upstream], fields: dict[str, Any], named: str
) -> None:
    p, up = provider
    with pytest.raises(ProviderError) as err:
        await p.complete(make_call(**fields))
    assert err.value.error_class is ErrorClass.BAD_REQUEST and f"cannot honour {named}" in err.value.message
    assert not up.received


async def test_the_in_cluster_model_gets_text_only() -> None:
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "there"}]
    call = make_call([{"role": "system", "content": "be brief"}, {"role": "user", "content": parts}], temperature=0.3)
    assert local_chat_request("local", call) == {
        "model": "model-v1",
        "messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}],
        "max_tokens": 64,
        "request_id": "r1",
        "temperature": 0.3,
    }


@pytest.mark.parametrize(
    ("fields", "named"),
    [
        ({"tools": (WEATHER,)}, "tools"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"messages": HISTORY[:3]}, "messages[2].tool_calls"),
        ({"messages": [{"role": "tool", "tool_call_id": "c", "content": "x"}]}, "messages[0].role"),
        (
            {
                "messages": [
                    {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "https://x/y.png"}}]}
                ]
            },
            "messages[0].content[0]",
        ),
    ],
)
async def test_the_in_cluster_model_refuses_what_it_cannot_read(fields: dict[str, Any], named: str) -> None:
    with pytest.raises(ProviderError) as err:
        local_chat_request("local", make_call(**fields))
    assert err.value.error_class is ErrorClass.BAD_REQUEST and f"local cannot honour {named}" in err.value.message
    # (async only because the module's tests share the session loop)
