"""After a load of mixed requests — text and tool calls, streamed and not, fallbacks, broken
answers, clients that hang up — the token and cost counters equal the sums of the audit
log's bills, model by model, and every request has exactly one audit record.

Seeded: a failure prints the seed and the scenario; `GW_USAGE_SCENARIOS` runs more (bench)."""

from __future__ import annotations

import asyncio
import json
import os
import random
from collections import Counter, defaultdict
from typing import Any

import openai
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness

pytestmark = pytest.mark.asyncio(loop_scope="session")

SCENARIOS = int(os.environ.get("GW_USAGE_SCENARIOS", "60"))
WEATHER = {
    "type": "function",
    "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}},
}


def scenario(rng: random.Random) -> dict[str, Any]:
    return {
        "flow": rng.choice(["plain", "agent", "strict-json"]),
        "stream": rng.random() < 0.4,
        "tools": rng.random() < 0.4,
        "openai": rng.choice(["reply", "reply", "tool_calls", "500", "malformed", "json"]),
        "anthropic": rng.choice(["reply", "json", "500"]),
        "hang_up": rng.random() < 0.1,
    }


def fault(kind: str) -> Fault:
    return {
        "reply": Fault("reply", text="a plain answer"),
        "json": Fault("reply", text=json.dumps({"answer": "yes"})),
        "tool_calls": Fault("tool_calls", calls=[("get_weather", {"city": "Oslo"})]),
        "500": Fault("status", status=500),
        "malformed": Fault("malformed"),
    }[kind]


async def run_one(gw: Harness, upstreams: FakeUpstreams, s: dict[str, Any]) -> None:
    upstreams.openai.sticky = fault(s["openai"])
    upstreams.anthropic.sticky = fault(s["anthropic"])
    kw: dict[str, Any] = {"model": "auto", "messages": [{"role": "user", "content": "weather?"}]}
    if s["tools"] and s["flow"] == "agent":
        kw["tools"] = [WEATHER]
    client = gw.client("qa", timeout=10)
    headers = {"X-Switchyard-Flow": s["flow"]}
    try:
        if s["stream"]:
            stream = await client.chat.completions.create(
                **kw, stream=True, stream_options={"include_usage": True}, extra_headers=headers
            )
            async for _ in stream:
                if s["hang_up"]:
                    break  # the client leaves mid-stream
            await stream.close()
        else:
            await client.chat.completions.create(**kw, extra_headers=headers)
    except openai.APIError:
        pass  # failures are part of the load: they are charged and audited too


async def test_token_and_cost_counters_equal_the_audit_log(gw: Harness, upstreams: FakeUpstreams) -> None:
    seed = int(os.environ.get("GW_USAGE_SEED", "20261201"))
    rng = random.Random(seed)
    done: list[dict[str, Any]] = []
    for _ in range(SCENARIOS):
        s = scenario(rng)
        await run_one(gw, upstreams, s)
        done.append(s)
    await gw.pipeline.drain()
    await asyncio.sleep(0)
    where = f"seed {seed}; scenarios: {done}"

    billed_tokens: Counter[tuple[str, str, str]] = Counter()
    billed_completion: Counter[tuple[str, str, str]] = Counter()
    billed_usd: defaultdict[tuple[str, str, str], float] = defaultdict(float)
    for e in gw.audit.exchanges:
        assert abs(sum(b.nanos for b in e.bills) / 1e9 - e.cost_usd) < 1e-9, where
        for b in e.bills:
            key = (e.ctx.team, e.ctx.flow.flow, b.model)
            billed_tokens[key] += b.usage.prompt_tokens
            billed_completion[key] += b.usage.completion_tokens
            billed_usd[key] += b.nanos / 1e9
    assert dict(gw.metrics.prompt_tokens) == dict(billed_tokens), where
    assert dict(gw.metrics.completion_tokens) == dict(billed_completion), where
    assert gw.metrics.cost_usd.keys() == billed_usd.keys(), where
    for key, usd in billed_usd.items():
        assert abs(gw.metrics.cost_usd[key] - usd) < 1e-9, (key, where)
    # One audit record per request, and one latency observation per request.
    ids = [e.ctx.request_id for e in gw.audit.exchanges]
    assert len(ids) == len(set(ids)) == SCENARIOS, where
    observed = sum(h.count for h in gw.metrics.request_seconds.values())
    assert observed == SCENARIOS, where
    assert sum(gw.metrics.requests.values()) == SCENARIOS, where
