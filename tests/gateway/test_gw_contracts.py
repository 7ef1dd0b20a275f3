"""Output contracts and deadlines: wrong-shaped JSON never succeeds, repair or fall back as
the rule says, streaming flows with a schema are buffered, and deadlines bound retries."""

from __future__ import annotations

import json

import openai
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness

pytestmark = pytest.mark.asyncio(loop_scope="session")
TICKET = {"ticket": "router keeps rebooting", "categories": ["hardware", "billing"]}
GOOD = json.dumps({"category": "hardware", "confidence": 0.9})


async def triage(gw: Harness, stream: bool = False) -> object:
    client = gw.client("support")
    return await client.chat.completions.with_raw_response.create(
        model="auto",
        messages=[],
        stream=stream,
        extra_headers={"X-Switchyard-Flow": "triage"},
        extra_body={"variables": TICKET},
    )


async def test_valid_json_passes(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = GOOD
    raw = await triage(gw)
    assert json.loads(raw.parse().choices[0].message.content) == json.loads(GOOD)  # type: ignore[attr-defined]
    # The flow's schema is asked for natively where the model declares `json_schema`.
    fmt = upstreams.openai.received[-1]["response_format"]
    assert (
        fmt["type"] == "json_schema"
        and fmt["json_schema"]["schema"]
        == gw.pipeline.planner.flows.get(gw.store.current, "support", "triage").output_schema
    )
    assert gw.audit.exchanges[-1].contract_result == "valid"


async def test_invalid_output_falls_back_when_the_rule_says_so(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = json.dumps({"label": "hardware"})  # valid JSON, wrong shape
    upstreams.anthropic.reply = GOOD
    raw = await triage(gw)
    assert raw.headers["x-switchyard-fallback"] == "gpt-4o-mini:invalid_output"  # type: ignore[attr-defined]
    assert raw.headers["x-switchyard-provider"] == "anthropic"  # type: ignore[attr-defined]


async def test_fallback_with_wrong_shape_is_repaired_once_then_422(gw: Harness, upstreams: FakeUpstreams) -> None:
    """The fallback model answers valid JSON of the wrong shape: one repair attempt, then 422."""
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.sticky = Fault("reply", text=json.dumps({"category": "hardware", "confidence": 7}))
    with pytest.raises(openai.UnprocessableEntityError) as err:
        await triage(gw)
    assert "confidence" in err.value.message and "7" not in err.value.message.split("tried")[0].replace("422", "")
    assert len(upstreams.anthropic.received) == 2  # the answer, then the repair
    repair = upstreams.anthropic.received[-1]["messages"][-1]["content"]
    assert "did not match the required JSON schema" in repair
    assert gw.audit.exchanges[-1].contract_result == "invalid" and gw.audit.exchanges[-1].status_code == 422


async def test_repair_that_succeeds(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.faults.append(Fault("reply", text="Sure! Here you go"))
    upstreams.anthropic.faults.append(Fault("reply", text=GOOD))
    raw = await triage(gw)
    assert raw.headers["x-switchyard-provider"] == "anthropic"  # type: ignore[attr-defined]


async def test_streaming_flow_with_schema_is_buffered_and_validated(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = json.dumps({"nope": 1})
    upstreams.anthropic.reply = GOOD
    raw = await triage(gw, stream=True)
    assert raw.headers["x-switchyard-provider"] == "anthropic"  # type: ignore[attr-defined]
    text = ""
    async for chunk in raw.parse():  # type: ignore[attr-defined]
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert json.loads(text) == json.loads(GOOD)


async def test_deadline_expires_mid_retry(gw: Harness, upstreams: FakeUpstreams) -> None:
    """A 429 asks for a 10 s wait; the deadline leaves no room, so no retry: the flow's rule
    (qa/only-5xx) does not fall back on 429, and the client learns what was tried."""
    upstreams.openai.sticky = Fault("status", status=429, retry_after="10")
    client = gw.client("qa")
    with pytest.raises(openai.InternalServerError) as err:
        await client.chat.completions.create(
            model="auto",
            messages=[{"role": "user", "content": "x"}],
            extra_headers={"X-Switchyard-Flow": "only-5xx", "X-Switchyard-Deadline-Ms": "300"},
        )
    assert err.value.status_code == 503 and len(upstreams.openai.received) == 1


async def test_deadline_504_after_slow_retry(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.faults.append(Fault("status", status=503))
    upstreams.openai.faults.append(Fault("latency", delay_s=1.0))
    upstreams.anthropic.sticky = Fault("latency", delay_s=1.0)
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client("qa").chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Switchyard-Deadline-Ms": "400"}
        )
    assert err.value.status_code == 504
    assert "gpt-4o-mini (server_error), gpt-4o-mini (timeout)" in err.value.message


async def test_client_cannot_extend_the_deadline(gw: Harness, upstreams: FakeUpstreams) -> None:
    await gw.client("qa").chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "x"}], extra_headers={"X-Switchyard-Deadline-Ms": "999999"}
    )
    ctx = gw.audit.exchanges[-1].ctx
    assert round(ctx.deadline_s * 1000) == 5000  # qa/plain's deadline_ms


async def test_high_risk_fails_closed_without_durable_audit(gw_dirs: object, upstreams: FakeUpstreams) -> None:
    from gw_harness import build_harness

    policies, state, keys = gw_dirs  # type: ignore[misc]
    upstreams.reset()
    upstreams.anthropic.reply = json.dumps({"escalate": False, "reason": "routine"})
    h = build_harness(policies, state, keys, fail_durable_audit=True)
    try:
        with pytest.raises(openai.InternalServerError) as err:
            await h.client("payments").chat.completions.create(
                model="auto", messages=[], extra_body={"variables": {"dispute_id": "D-1", "summary": "receipt"}}
            )
        assert err.value.status_code == 503 and "routine" not in err.value.message
    finally:
        await h.aclose()
