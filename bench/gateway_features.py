"""Benchmark: what the gateway API features cost per request, side by side in one run.

The whole `ChatPipeline.handle` in-process (the test harness's gateway: in-memory budget and
audit, no-op redactor), with an in-process OpenAI provider, for one request shape each:
plain text (the baseline), 8 tool definitions, a two-turn tool conversation answered with a
tool call, `response_format: json_schema` (the answer validated against it), a 64 KB image
data URL, and the same plain request on a model counted by the exact o200k tokenizer versus
the byte-bound estimate. Prints thread-CPU p50/p99 in microseconds and each shape's ratio to
the plain request, then the token counter's own cost.

    .venv/bin/python bench/gateway_features.py [--n 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "gateway"))  # the test harness builds the same gateway

from gateway_pipeline import pct  # noqa: E402  (benchmark 1's percentile, bench/ is on the path)
from gw_harness import build_harness, make_keys, make_policies  # noqa: E402

from switchyard.budgets.tokens import count_input_tokens  # noqa: E402
from switchyard.gateway.providers.base import Completion, ProviderCall, ToolCall  # noqa: E402
from switchyard.gateway.providers.inprocess import InProcessProvider  # noqa: E402
from switchyard.gateway.seams import Usage  # noqa: E402

ASK = {"role": "user", "content": "What is the weather in Paris, and should I take an umbrella tomorrow?"}


def tool(i: int) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": f"tool_{i}",
            "description": "Looks something up for the assistant.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city"],
            },
        },
    }


SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "temp_c": {"type": "number"}, "umbrella": {"type": "boolean"}},
    "required": ["city", "temp_c", "umbrella"],
    "additionalProperties": False,
}
HISTORY = [
    ASK,
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "tool_0", "arguments": '{"city": "Paris"}'}}
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": '{"temp_c": 14, "rain_mm": 3.5}'},
]
IMAGE = "data:image/png;base64," + base64.b64encode(b"\x89PNG\r\n\x1a\n" + os.urandom(64 * 1024)).decode()

SHAPES: dict[str, dict[str, Any]] = {
    "plain text (baseline)": {"messages": [ASK]},
    "8 tool definitions": {"messages": [ASK], "tools": [tool(i) for i in range(8)]},
    "tool conversation, tool-call answer": {"messages": HISTORY, "tools": [tool(0)]},
    "response_format json_schema": {
        "messages": [ASK],
        "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": SCHEMA, "strict": True}},
    },
    "64 KB image (data URL)": {
        "messages": [
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "what is this?"},
                    {"type": "image_url", "image_url": {"url": IMAGE}},
                ],
            }
        ]
    },
}


async def answer(call: ProviderCall) -> Completion:
    if call.tools and call.messages[-1].get("role") != "tool":
        return Completion(
            "",
            Usage(120, 12),
            "tool_calls",
            call.model_version,
            tool_calls=(ToolCall("call_2", "tool_0", '{"city": "Paris"}'),),
        )
    if call.output is not None:
        return Completion(
            '{"city": "Paris", "temp_c": 14, "umbrella": true}', Usage(80, 14), "stop", call.model_version
        )
    return Completion("Take an umbrella.", Usage(40, 5), "stop", call.model_version)


def thread_timed(fn: Callable[[], object], n: int) -> list[float]:
    """Thread CPU microseconds of each of `n` calls (benchmark 1's `timed` takes wall time)."""
    out = []
    for _ in range(n):
        t = time.thread_time_ns()
        fn()
        out.append((time.thread_time_ns() - t) / 1000)
    return out


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        policies = make_policies(root / "policies", "http://127.0.0.1:9")
        keys = make_keys(root / "state")
        openai = InProcessProvider("openai", answer)
        gw = build_harness(policies, root / "state", keys, overrides={"openai": openai})
        headers = {"authorization": f"Bearer {keys['qa']}", "x-switchyard-flow": "agent"}
        gc.collect()
        gc.freeze()  # as Serve does after start-up
        results: dict[str, list[float]] = {}
        for name, shape in SHAPES.items():
            body = json.dumps({"model": "auto", **shape}).encode()
            cpu: list[float] = []
            for i in range(n + 200):
                c = time.thread_time_ns()
                result = await gw.pipeline.handle(body, headers)
                if i >= 200:  # warm-up excluded
                    cpu.append((time.thread_time_ns() - c) / 1000)
                assert getattr(result, "status", 0) == 200, (name, result)
            results[name] = cpu
        await gw.aclose()
    base = statistics.median(results["plain text (baseline)"])
    print(f"gateway features in-process, n={n} requests per shape (thread CPU microseconds per request)")
    print(f"{'request shape':40} {'p50':>8} {'p99':>8} {'p50 ratio':>10}")
    for name, s in results.items():
        print(f"{name:40} {pct(s, 0.5):8.1f} {pct(s, 0.99):8.1f} {statistics.median(s) / base:9.2f}x")

    prompt = [{"role": "system", "content": "You are a helpful assistant. " * 20}, ASK]
    exact = thread_timed(lambda: count_input_tokens("o200k", prompt), n)
    bound = thread_timed(lambda: count_input_tokens("generic", prompt), n)
    print(
        f"\ninput-token count of a {sum(len(m['content']) for m in prompt)}-char prompt: exact o200k p50 "
        f"{pct(exact, 0.5):.1f} us ({count_input_tokens('o200k', prompt)} tokens), byte bound p50 "
        f"{pct(bound, 0.5):.1f} us ({count_input_tokens('generic', prompt)} tokens)"
    )
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"reproduce: .venv/bin/python bench/gateway_features.py --n {n}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    asyncio.run(main(ap.parse_args().n))
