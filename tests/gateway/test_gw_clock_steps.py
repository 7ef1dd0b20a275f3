"""The wall clock steps while a request is in flight; its deadline and latencies must not.

An NTP step, a VM resumed after a pause or a live migration, or an operator setting the date
moves the wall clock by seconds to hours at once. The gateway measured its latency budgets and
latencies on the wall clock (stop 47). Forward: a request still well inside its 5 s budget was
answered 504 `deadline_exceeded` without any provider being called. Backward: the audit record,
the attempts and the `server-timing` header carried latencies of minus an hour.

Now `GatewayParts.timer` (monotonic) measures durations and deadlines; the wall clock only
stamps records and picks the budget day. Each case steps the wall clock the gateway reads,
by a drawn amount, from a drawn reading on (which lands the step before, between or after the
stages that read it), and checks what the client and the audit record see.
"""

from __future__ import annotations

import re
import time

import pytest
from gw_harness import Harness, SteppedWallClock

STEPS_S = (-86_400.0, -3_600.0, -1.0, 10.0, 3_600.0)  # the flow's deadline is 5 s
AFTER_READINGS = (1, 2, 3)
ASK = [{"role": "user", "content": "hello there"}]


def _step_the_wall_clock(gw: Harness, clock: SteppedWallClock) -> None:
    gw.parts.clock = clock
    gw.pipeline.runner.clock = clock


@pytest.mark.parametrize("stream", [False, True], ids=["completion", "stream"])
@pytest.mark.parametrize("after", AFTER_READINGS)
@pytest.mark.parametrize("step_s", STEPS_S)
async def test_a_wall_clock_step_moves_no_deadline_and_no_latency(
    gw: Harness, step_s: float, after: int, stream: bool
) -> None:
    _step_the_wall_clock(gw, SteppedWallClock(step_s, after))
    calls = gw.local.calls
    client = gw.client("qa")
    began = time.perf_counter()
    raw = await client.chat.completions.with_raw_response.create(
        model="auto", messages=ASK, stream=stream, extra_headers={"X-Switchyard-Flow": "local-only"}
    )
    if stream:
        async for _ in raw.parse():
            pass
    elapsed_ms = (time.perf_counter() - began) * 1000
    assert raw.status_code == 200 and gw.local.calls == calls + 1, "a step of the wall clock timed the request out"
    exchange = gw.audit.exchanges[-1]
    assert exchange.status_code == 200 and exchange.error_code is None
    assert 0 <= exchange.latency_ms <= elapsed_ms, f"recorded latency {exchange.latency_ms} ms of {elapsed_ms} ms"
    for attempt in exchange.attempts:
        assert 0 <= attempt.latency_ms <= elapsed_ms, f"attempt latency {attempt.latency_ms} ms of {elapsed_ms} ms"
    if not stream:
        timing = raw.headers["server-timing"]
        durations = [float(d) for d in re.findall(r"dur=(-?[0-9.]+)", timing)]
        assert all(0 <= d <= elapsed_ms for d in durations), timing
