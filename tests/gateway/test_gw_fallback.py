"""Explicit fallback: which error classes move on, compliance filtering, eval-gated
high-risk flows, and fallbacks that are counted, never hidden."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import openai
import pytest
import yaml
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness

from switchyard.gateway.eval_signing import EvalSigner
from switchyard.gateway.evals import EvalRecord, EvalVerdict, record_path, write_record
from switchyard.gateway.routing import plan_route
from switchyard.gateway.seams import Exchange
from switchyard.policy.models import ErrorClass, FallbackCandidate

pytestmark = pytest.mark.asyncio(loop_scope="session")

MSG = [{"role": "user", "content": "hello"}]


async def ask(gw: Harness, team: str = "qa", flow: str = "plain", **kw: object) -> openai.types.chat.ChatCompletion:
    raw = await gw.client(team).chat.completions.with_raw_response.create(
        model="auto",
        messages=kw.pop("messages", MSG),
        extra_headers={"X-Switchyard-Flow": flow},
        **kw,  # type: ignore[arg-type]
    )
    done = raw.parse()
    done._headers = raw.headers  # type: ignore[attr-defined]
    return done


async def test_5xx_falls_back_and_is_counted(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.reply = "from claude"
    done = await ask(gw)
    h = done._headers  # type: ignore[attr-defined]
    assert done.choices[0].message.content == "from claude"
    assert h["x-switchyard-provider"] == "anthropic" and h["x-switchyard-fallback"] == "gpt-4o-mini:server_error"
    # The outage is visible although the request succeeded: failures and the fallback are counted.
    assert gw.metrics.fallbacks[("openai", "anthropic", "server_error")] == 1
    assert gw.metrics.attempt_failures[("openai", "server_error")] == 2  # first try + one retry
    attempts = gw.audit.exchanges[-1].attempts
    assert [a.provider for a in attempts] == ["openai", "openai", "anthropic"]
    status = await gw.status()
    assert {"from": "openai", "to": "anthropic", "reason": "server_error", "count": 1} in status["counters"][
        "fallbacks"
    ]


@pytest.mark.parametrize(
    ("fault", "reason"),
    [(Fault("latency", delay_s=1.0), "timeout"), (Fault("reset"), "connection"), (Fault("malformed"), "server_error")],
)
async def test_default_rule_falls_back_on_provider_faults(
    gw: Harness, upstreams: FakeUpstreams, fault: Fault, reason: str
) -> None:
    upstreams.openai.sticky = fault
    done = await ask(gw)
    assert done._headers["x-switchyard-fallback"] == f"gpt-4o-mini:{reason}"  # type: ignore[attr-defined]
    assert gw.metrics.fallbacks[("openai", "anthropic", reason)] == 1


async def test_content_filter_falls_back_only_where_the_rule_says(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("filtered")
    done = await ask(gw, flow="filtered")
    assert done._headers["x-switchyard-fallback"] == "gpt-4o-mini:content_filter"  # type: ignore[attr-defined]
    with pytest.raises(openai.BadRequestError) as err:
        await ask(gw, flow="plain")  # the default rule does not list content_filter
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "content_filter"


async def test_context_length_falls_back_where_the_rule_says(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=400, error_type="context_length_exceeded")
    done = await ask(gw, flow="filtered")
    assert done._headers["x-switchyard-fallback"] == "gpt-4o-mini:context_length"  # type: ignore[attr-defined]


async def test_retry_honours_retry_after_then_succeeds(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.faults.append(Fault("status", status=429, retry_after="0"))
    done = await ask(gw)
    assert done._headers["x-switchyard-provider"] == "openai"  # type: ignore[attr-defined]
    assert done._headers["x-switchyard-fallback"] == "none"  # type: ignore[attr-defined]
    assert len(upstreams.openai.received) == 2 and not upstreams.anthropic.received


async def test_rule_without_the_error_class_does_not_fall_back(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=429, retry_after="1")
    with pytest.raises(openai.InternalServerError) as err:
        await ask(gw, flow="only-5xx")
    assert err.value.status_code == 503 and err.value.response.headers["retry-after"] == "1"
    assert not upstreams.anthropic.received


@pytest.mark.parametrize("sent", ["inf", "Infinity", "1e999", "1e300", "-5", "nan", "86401"])
async def test_an_upstream_retry_after_that_is_no_delay_is_not_passed_on(
    gw: Harness, upstreams: FakeUpstreams, sent: str
) -> None:
    """`Retry-After: inf` made the 503 a 500 (`math.ceil(inf)`), and `1e300` was passed on as
    a 301-digit delay. A delay the gateway passes on is whole seconds, 1 to 86,400 (a day)."""
    upstreams.openai.sticky = Fault("status", status=429, retry_after=sent)
    with pytest.raises(openai.InternalServerError) as err:
        await ask(gw, flow="only-5xx")
    assert err.value.status_code == 503, err.value.response.text
    retry = err.value.response.headers.get("retry-after")
    assert retry is None or 1 <= int(retry) <= 86_400, retry


@pytest.mark.parametrize(
    ("error_type", "code"),
    [("invalid_request_error", "upstream_rejected_request"), ("context_length_exceeded", "context_length_exceeded")],
)
async def test_request_errors_never_fall_back(
    gw: Harness, upstreams: FakeUpstreams, error_type: str, code: str
) -> None:
    upstreams.openai.sticky = Fault("status", status=400, error_type=error_type)
    with pytest.raises(openai.BadRequestError) as err:
        await ask(gw)
    assert isinstance(err.value.body, dict) and err.value.body["code"] == code
    assert not upstreams.anthropic.received and len(upstreams.openai.received) == 1


async def test_compliance_filters_candidates(gw: Harness, upstreams: FakeUpstreams) -> None:
    """qa/notes is `regulated` (needs hipaa): anthropic lacks it and is skipped; local has it."""
    upstreams.bedrock.sticky = Fault("status", status=500)
    done = await ask(gw, flow="notes")
    h = done._headers  # type: ignore[attr-defined]
    assert h["x-switchyard-provider"] == "local" and h["x-switchyard-fallback"] == "bedrock-claude-sonnet:server_error"
    assert not upstreams.anthropic.received
    assert gw.metrics.skips[("anthropic", "compliance_missing:hipaa")] == 1


async def test_stream_has_no_fallback_after_the_first_byte(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.reply = "y" * 80
    upstreams.openai.faults.append(Fault("die_midway"))
    stream = await gw.client("qa").chat.completions.create(model="auto", messages=MSG, stream=True)  # type: ignore[arg-type]
    got = ""
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                got += chunk.choices[0].delta.content
    assert 0 < len(got) < 80 and not upstreams.anthropic.received
    assert gw.audit.exchanges[-1].status_code == 502 and gw.audit.exchanges[-1].error_code == "stream_interrupted"
    # The record's streamed attempt says how it ended, and that its usage was never read.
    streamed = gw.audit.exchanges[-1].attempts[-1]
    assert streamed.error_class is ErrorClass.CONNECTION and streamed.billed_unknown


async def failed_stream(gw: Harness, headers: dict[str, str] | None = None) -> Exchange:
    """Stream a request that fails after its first byte; its audited exchange, once settled."""
    stream = await gw.client("qa").chat.completions.create(
        model="auto",
        messages=MSG,  # type: ignore[arg-type]
        stream=True,
        extra_headers=headers or {},
    )
    with pytest.raises(openai.APIError):
        async for _ in stream:
            pass
    await gw.pipeline.drain()
    exchange: Exchange = gw.audit.exchanges[-1]
    return exchange


async def test_a_stream_whose_end_comes_after_the_deadline_is_charged_its_bound_and_says_so(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    """Found by the money invariants (seed 13): the provider streamed its answer and its usage,
    then `[DONE]` came after the gateway gave up. The usage was never read, so the stream is
    charged its bound; the record's streamed attempt used to say it answered cleanly, usage
    read, which made its charge look like an overcharge of what the provider reported."""
    upstreams.openai.faults.append(Fault("stall_before_done", delay_s=0.6))
    done = await failed_stream(gw, {"X-Switchyard-Deadline-Ms": "300"})
    assert (done.status_code, done.error_code) == (504, "deadline_exceeded")
    streamed = done.attempts[-1]
    assert streamed.error_class is ErrorClass.TIMEOUT and streamed.billed_unknown
    assert streamed.usage == done.usage and done.usage is not None
    assert done.usage.completion_tokens > 7  # the bound, not the 7 the provider reported unread
    assert [(b.usage, b.basis) for b in done.bills] == [(done.usage, "bound")]  # billed once, at that bound
    await asyncio.sleep(0.4)  # the fake finishes its stalled answer before the next test


async def test_a_finished_stream_without_usage_says_it_was_charged_the_bound(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    """Found by the money invariants once bills said what they were charged at (stop 43): a
    stream that finished without a usage chunk was charged the bound, but its attempt carried
    that bound as the usage it read, `billed_unknown` unset, so its record claimed the
    provider's numbers."""
    upstreams.openai.reply = "z" * 40
    upstreams.openai.faults.append(Fault("no_usage"))
    stream = await gw.client("qa").chat.completions.create(model="auto", messages=MSG, stream=True)  # type: ignore[arg-type]
    text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    await gw.pipeline.drain()
    done: Exchange = gw.audit.exchanges[-1]
    assert text == "z" * 40 and done.status_code == 200
    streamed = done.attempts[-1]
    assert streamed.error_class is None and streamed.billed_unknown
    assert [(b.usage, b.basis) for b in done.bills] == [(done.usage, "bound")]


async def test_a_stream_whose_provider_goes_silent_names_the_provider_not_the_deadline(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    """The provider's read timeout (0.5 s here) fired mid-stream, long before the flow's
    deadline: the error names the provider's timeout, as a non-streamed request's would."""
    upstreams.openai.reply = "x" * 64
    upstreams.openai.faults.append(Fault("stall_midway", delay_s=0.9))
    done = await failed_stream(gw)
    assert (done.status_code, done.error_code) == (504, "provider_timeout")
    assert done.attempts[-1].error_class is ErrorClass.TIMEOUT and done.attempts[-1].billed_unknown
    await asyncio.sleep(0.5)  # the fake finishes its stalled answer before the next test


async def test_stream_falls_back_before_the_first_byte(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=503)
    upstreams.anthropic.reply = "claude streams"
    resp = await gw.client("qa").chat.completions.with_raw_response.create(model="auto", messages=MSG, stream=True)  # type: ignore[arg-type]
    assert resp.headers["x-switchyard-fallback"] == "gpt-4o-mini:server_error"
    text = ""
    async for chunk in resp.parse():
        if chunk.choices and chunk.choices[0].delta.content:
            text += chunk.choices[0].delta.content
    assert text == "claude streams"


async def test_a_chain_cannot_loop(gw: Harness) -> None:
    ps = gw.store.current
    flow = ps.teams["qa"].flows["plain"]
    from switchyard.policy.layering import resolve_flow

    resolved = resolve_flow(ps, "qa", "plain")
    assert not isinstance(resolved, list)
    looping = resolved.policy.model_copy(
        update={
            "fallback": (
                FallbackCandidate(model="claude-haiku"),
                FallbackCandidate(model="gpt-4o-mini"),
                FallbackCandidate(model="claude-haiku"),
            )
        }
    )
    route = plan_route(ps, looping, "gpt-4o-mini", lambda f, m, e: EvalVerdict(True, "eval_passed"))
    assert [c.model for c in route.candidates] == ["gpt-4o-mini", "claude-haiku"]
    assert flow.model == "gpt-4o-mini"


# ---------------------------------------------------------------- high-risk, eval-gated


@pytest.fixture
def payments_record(gw: Harness) -> Iterator[Path]:
    ps = gw.store.current
    path = record_path(ps.root, "payments", "dispute-review", "bedrock-claude-sonnet")
    yield path
    path.unlink(missing_ok=True)
    gw.store.refresh()


def _signed(gw_dirs: tuple[Path, Path, dict[str, str]], record: EvalRecord) -> EvalRecord:
    """Signed with the harness state dir's key, as `switchyard eval run` signs what it writes."""
    return EvalSigner.in_state_dir(gw_dirs[1]).sign(record, signed_by="operator-key-id")


def _valid_record(gw: Harness) -> EvalRecord:
    ps = gw.store.current
    version = ps.prompts["payment-risk"].get(1)
    assert version is not None
    suite = ps.root / "evals" / "suites" / "payment-risk.yaml"
    import hashlib

    return EvalRecord(
        team="payments",
        flow="dispute-review",
        candidate="bedrock-claude-sonnet",
        model_version=ps.providers.models["bedrock-claude-sonnet"].model_version,
        prompt_ref=f"payment-risk@1#{version.content_hash()[:12]}",
        prompt_sha256=version.content_hash(),
        suite="payment-risk.yaml",
        suite_sha256=hashlib.sha256(suite.read_bytes()).hexdigest(),
        threshold=0.95,
        score=1.0,
        cases=2,
        passed_cases=2,
        run_at=datetime.now(UTC).isoformat(),
    )


async def _dispute(gw: Harness) -> openai.types.chat.ChatCompletion:
    return await ask(
        gw,
        team="payments",
        flow="dispute-review",
        messages=[],
        extra_body={"variables": {"dispute_id": "D-42", "summary": "card stolen"}},
    )


async def test_high_risk_without_record_does_not_fall_back(
    gw: Harness, upstreams: FakeUpstreams, payments_record: Path
) -> None:
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await _dispute(gw)
    assert "bedrock-claude-sonnet (no_eval_record)" in err.value.message
    assert not upstreams.bedrock.received
    assert gw.metrics.skips[("bedrock", "no_eval_record")] == 1


async def test_high_risk_with_valid_record_falls_back(
    gw: Harness, upstreams: FakeUpstreams, payments_record: Path, gw_dirs: tuple[Path, Path, dict[str, str]]
) -> None:
    write_record(payments_record, _signed(gw_dirs, _valid_record(gw)))
    assert gw.store.refresh()
    upstreams.anthropic.sticky = Fault("status", status=500)
    upstreams.bedrock.reply = '{"escalate": true, "reason": "stolen card"}'
    done = await _dispute(gw)
    assert done._headers["x-switchyard-provider"] == "bedrock"  # type: ignore[attr-defined]
    assert done._headers["x-switchyard-fallback"] == "claude-sonnet:server_error"  # type: ignore[attr-defined]


@pytest.mark.parametrize("change", ["model_version", "prompt_sha256", "suite_sha256"])
async def test_high_risk_with_stale_record_does_not_fall_back(
    gw: Harness,
    upstreams: FakeUpstreams,
    payments_record: Path,
    change: str,
    gw_dirs: tuple[Path, Path, dict[str, str]],
) -> None:
    record = _signed(gw_dirs, _valid_record(gw).model_copy(update={change: "0" * 12}))
    write_record(payments_record, record)
    assert gw.store.refresh()
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await _dispute(gw)
    assert "stale_eval_record" in err.value.message and not upstreams.bedrock.received


async def test_record_below_threshold_does_not_count(
    gw: Harness, upstreams: FakeUpstreams, payments_record: Path, gw_dirs: tuple[Path, Path, dict[str, str]]
) -> None:
    write_record(payments_record, _signed(gw_dirs, _valid_record(gw).model_copy(update={"score": 0.5})))
    gw.store.refresh()
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await _dispute(gw)
    assert "eval_below_threshold" in err.value.message


async def test_shipped_suite_is_valid_yaml() -> None:
    from switchyard.gateway.evals import load_suite

    suite = load_suite(Path(__file__).resolve().parents[2] / "policies" / "evals" / "suites" / "payment-risk.yaml")
    assert len(suite.cases) >= 2 and yaml.safe_dump(suite.model_dump())


async def test_high_risk_with_unsigned_record_does_not_fall_back(
    gw: Harness, upstreams: FakeUpstreams, payments_record: Path
) -> None:
    """Regression: records were unsigned YAML, so anyone who could write one under
    policies/evals/records/ could make a high-risk flow fall back to an unproven model."""
    write_record(payments_record, _valid_record(gw))  # every field right, but no signature
    assert gw.store.refresh()
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await _dispute(gw)
    assert "bedrock-claude-sonnet (unsigned_eval_record)" in err.value.message
    assert not upstreams.bedrock.received


async def test_high_risk_with_tampered_record_does_not_fall_back(
    gw: Harness, upstreams: FakeUpstreams, payments_record: Path, gw_dirs: tuple[Path, Path, dict[str, str]]
) -> None:
    """A failing run's record, its score raised by hand afterwards: the signature no longer holds."""
    failing = _signed(gw_dirs, _valid_record(gw).model_copy(update={"score": 0.5, "passed_cases": 1}))
    write_record(payments_record, failing.model_copy(update={"score": 1.0, "passed_cases": 2}))
    assert gw.store.refresh()
    upstreams.anthropic.sticky = Fault("status", status=500)
    with pytest.raises(openai.InternalServerError) as err:
        await _dispute(gw)
    assert "bedrock-claude-sonnet (bad_eval_signature)" in err.value.message
    assert not upstreams.bedrock.received
