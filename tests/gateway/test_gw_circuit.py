"""Circuit breakers: open on a failure rate, reject while open, probe half-open, close."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import build_harness

from switchyard.gateway.circuit import BreakerSettings, CircuitBreaker, CircuitState
from switchyard.policy.models import ErrorClass

pytestmark = pytest.mark.asyncio(loop_scope="session")


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_breaker_opens_half_opens_and_closes() -> None:
    clock = Clock()
    changes: list[tuple[str, CircuitState]] = []
    b = CircuitBreaker(
        "p",
        BreakerSettings(window_s=10, min_calls=4, failure_rate=0.5, open_s=5, half_open_probes=2),
        clock,
        lambda p, s: changes.append((p, s)),
    )
    for error in (None, ErrorClass.SERVER_ERROR, None, ErrorClass.TIMEOUT):
        assert b.allow()
        b.record(error)
    assert b.state is CircuitState.OPEN and not b.allow()
    clock.now += 5
    assert b.allow() and b.allow() and not b.allow()  # two probes, no third
    assert b.state is CircuitState.HALF_OPEN
    b.record(None)
    b.record(None)
    assert b.state is CircuitState.CLOSED and b.allow()
    assert [s for _, s in changes] == [CircuitState.OPEN, CircuitState.HALF_OPEN, CircuitState.CLOSED]


async def test_failed_probe_reopens_and_request_errors_do_not_count() -> None:
    clock = Clock()
    b = CircuitBreaker(
        "p", BreakerSettings(window_s=10, min_calls=2, failure_rate=0.5, open_s=5, half_open_probes=1), clock
    )
    for _ in range(5):
        b.allow()
        b.record(ErrorClass.BAD_REQUEST)  # the client's fault, not the provider's
    assert b.state is CircuitState.CLOSED
    while b.state is CircuitState.CLOSED:
        assert b.allow()
        b.record(ErrorClass.CONNECTION)
    assert b.times_opened == 1 and len([f for _, f in b._outcomes if f]) == 5  # 5 of 10 calls failed
    clock.now += 6
    assert b.allow()
    b.record(ErrorClass.SERVER_ERROR)
    assert b.state is CircuitState.OPEN and b.times_opened == 2
    clock.now += 2
    assert not b.allow()  # the open period restarted with the failed probe


async def test_old_outcomes_leave_the_window() -> None:
    clock = Clock()
    b = CircuitBreaker("p", BreakerSettings(window_s=10, min_calls=3, failure_rate=0.5), clock)
    for _ in range(2):
        b.allow()
        b.record(ErrorClass.TIMEOUT)
    clock.now += 11
    b.allow()
    b.record(ErrorClass.TIMEOUT)
    assert b.state is CircuitState.CLOSED  # only one failure inside the window


async def test_open_circuit_skips_the_provider_and_is_counted(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    policies, state, keys = gw_dirs
    gw = build_harness(
        policies, state, keys, breaker=BreakerSettings(min_calls=2, failure_rate=0.5, open_s=0.3, half_open_probes=1)
    )
    try:
        upstreams.openai.sticky = Fault("status", status=500)
        upstreams.anthropic.reply = "via claude"
        client = gw.client("qa")
        msg = [{"role": "user", "content": "hi"}]
        await client.chat.completions.create(model="auto", messages=msg)  # type: ignore[arg-type]
        assert gw.parts.circuits.breaker("openai").state is CircuitState.OPEN
        before = len(upstreams.openai.received)
        raw = await client.chat.completions.with_raw_response.create(model="auto", messages=msg)  # type: ignore[arg-type]
        assert raw.headers["x-switchyard-fallback"] == "gpt-4o-mini:circuit_open"
        assert len(upstreams.openai.received) == before  # not called while open
        assert gw.metrics.circuit_changes[("openai", "open")] == 1
        assert gw.metrics.skips[("openai", "circuit_open")] == 1
        status = await gw.status()
        assert status["circuits"]["openai"]["state"] == "open"
        # After open_s, one probe goes through; it succeeds and the circuit closes.
        upstreams.openai.sticky = None
        import asyncio

        await asyncio.sleep(0.35)
        raw = await client.chat.completions.with_raw_response.create(model="auto", messages=msg)  # type: ignore[arg-type]
        assert raw.headers["x-switchyard-provider"] == "openai"
        assert gw.parts.circuits.breaker("openai").state is CircuitState.CLOSED
        assert gw.metrics.circuit_changes[("openai", "half_open")] == 1
        assert gw.metrics.circuit_changes[("openai", "closed")] == 1
        # With no fallback that accepts the failure, an open circuit is a 503, not a hang.
        upstreams.openai.sticky = Fault("status", status=500)
        upstreams.anthropic.sticky = Fault("status", status=500)
        for _ in range(3):
            with pytest.raises(openai.InternalServerError):
                await client.chat.completions.create(model="auto", messages=msg)  # type: ignore[arg-type]
    finally:
        await gw.aclose()
