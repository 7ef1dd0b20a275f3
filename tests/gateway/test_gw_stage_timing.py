"""`server-timing` per stage for benchmark runs (`SWITCHYARD_SERVER_TIMING=stages`): the stages a
request went through, each with its time, within the gateway's own time; off, the header keeps
its two entries. In process, through the real pipeline, the official SDK and the fake upstream."""

from __future__ import annotations

from pathlib import Path

import pytest
from gw_fakes import FakeUpstreams
from gw_harness import build_harness

from switchyard.gateway.stage_timing import STAGE_TIMING_ENV, stage_timing_from_env

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def entries(header: str) -> dict[str, float]:
    out = {}
    for item in header.split(","):
        name, _, dur = item.strip().partition(";dur=")
        out[name] = float(dur)
    return out


async def server_timing(gw_dirs: tuple[Path, Path, dict[str, str]], stages: bool) -> dict[str, float]:
    policies, state, keys = gw_dirs
    gw = build_harness(policies, state, keys)
    gw.parts.stage_timing = stages
    try:
        answer = await gw.client("qa").chat.completions.with_raw_response.create(model="auto", messages=ASK)
        await gw.pipeline.drain()
    finally:
        await gw.aclose()
    return entries(answer.headers["server-timing"])


async def test_each_stage_is_timed_within_the_gateways_time(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    timing = await server_timing(gw_dirs, stages=True)
    stages = {"plan", "redaction", "budget.reserve", "budget.settle"}
    assert stages <= set(timing), timing
    assert all(ms >= 0 for ms in timing.values()), timing
    assert timing["upstream"] > 0
    within = sum(ms for name, ms in timing.items() if name not in ("gateway", "upstream"))
    assert within <= timing["gateway"] + 0.01, timing  # the stages are part of the gateway's time


async def test_off_the_header_keeps_the_gateway_and_upstream_only(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    assert set(await server_timing(gw_dirs, stages=False)) == {"gateway", "upstream"}


def test_the_environment_switch_names_a_bad_value() -> None:
    assert stage_timing_from_env({}) is False
    assert stage_timing_from_env({STAGE_TIMING_ENV: "off"}) is False
    assert stage_timing_from_env({STAGE_TIMING_ENV: "stages"}) is True
    with pytest.raises(ValueError, match="SWITCHYARD_SERVER_TIMING='stage': expected 'stages' or 'off'"):
        stage_timing_from_env({STAGE_TIMING_ENV: "stage"})
