"""Serve's own backpressure: a deployment whose queue is full (`max_queued_requests`) makes
the handle raise BackPressureError, which the gateway answers 503 `overloaded` + Retry-After.

    flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/gateway/test_gw_backpressure.py
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from gw_harness import build_harness

pytestmark = [pytest.mark.ray, pytest.mark.asyncio(loop_scope="session")]

APP = "backpressure-test"


@pytest.fixture(scope="module")
def slow_model(serve_http: str) -> Iterator[Any]:
    """One replica, one request at a time, one more may wait: the third concurrent call is refused."""
    from ray import serve

    @serve.deployment(max_ongoing_requests=1, max_queued_requests=1, ray_actor_options={"num_cpus": 0})
    class SlowModel:
        async def chat(self, request: dict[str, Any]) -> dict[str, Any]:
            await asyncio.sleep(1.0)  # long enough for the burst below to find the queue full
            return {
                "model": "slow",
                "choices": [{"message": {"content": "slow answer"}, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 2},
            }

    handle = serve.run(SlowModel.bind(), name=APP, route_prefix=None)  # type: ignore[attr-defined]
    try:
        yield handle
    finally:
        # Waiting for the deletion costs ~30 s here; the app has no route and holds no CPUs.
        serve.delete(APP, _blocking=False)


async def test_full_serve_queue_is_a_503_with_retry_after(
    slow_model: Any, gw_dirs: tuple[Path, Path, dict[str, str]]
) -> None:
    from switchyard.cluster.serve_handle import ServeHandleProvider

    gw = build_harness(*gw_dirs, overrides={"local": ServeHandleProvider("local", slow_model)})
    http = gw.raw()
    headers = {"authorization": f"Bearer {gw_dirs[2]['demo']}"}  # demo/chat: local-gpt, no fallback
    body = {"model": "auto", "messages": [{"role": "user", "content": "hi"}]}
    try:
        burst = await asyncio.gather(*(http.post("/v1/chat/completions", json=body, headers=headers) for _ in range(4)))
        ok = [r for r in burst if r.status_code == 200]
        shed: list[httpx.Response] = [r for r in burst if r.status_code != 200]
        assert ok and shed, [r.status_code for r in burst]
        assert ok[0].json()["choices"][0]["message"]["content"] == "slow answer"
        for r in shed:
            assert r.status_code == 503 and r.json()["error"]["code"] == "overloaded", r.text
            assert int(r.headers["retry-after"]) >= 1
        assert gw.metrics.sheds[("demo", "chat", "standard", "backpressure")] == len(shed)
        assert gw.parts.circuits.breaker("local").failure_rate() == 0.0
    finally:
        await gw.aclose()
