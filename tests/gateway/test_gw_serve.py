"""The Serve app on a real local Ray cluster: the OpenAI SDK over HTTP, the local model
through its handle, and the idempotency store shared by two replicas.

    flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/gateway/test_gw_serve.py
"""

from __future__ import annotations

import concurrent.futures

import httpx
import openai
import pytest
from gw_fakes import FakeUpstreams

pytestmark = pytest.mark.ray


def client(base: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0, timeout=60)


def test_chat_through_serve(
    serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    upstreams.openai.reply = "served by ray"
    raw = client(serve_gateway, gw_dirs[2]["qa"]).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hi"}]
    )
    assert raw.parse().choices[0].message.content == "served by ray"
    assert raw.headers["x-switchyard-provider"] == "openai"
    assert raw.headers["x-switchyard-prompt-version"].startswith("assistant@1#")
    with pytest.raises(openai.AuthenticationError):
        client(serve_gateway, "sy_bad_key").chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "hi"}]
        )


def test_local_model_through_its_handle(serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]]) -> None:
    raw = client(serve_gateway, gw_dirs[2]["demo"]).chat.completions.with_raw_response.create(
        model="auto", messages=[{"role": "user", "content": "hello"}], max_tokens=16
    )
    done = raw.parse()
    assert raw.headers["x-switchyard-provider"] == "local"
    assert raw.headers["x-switchyard-model"].startswith("switchyard-gpt-tiny@")
    assert done.usage is not None and 0 < done.usage.completion_tokens <= 16
    stream = client(serve_gateway, gw_dirs[2]["demo"]).chat.completions.create(
        model="auto", messages=[{"role": "user", "content": "hello"}], max_tokens=8, stream=True
    )
    assert sum(1 for _ in stream) >= 2


def test_idempotency_is_shared_by_replicas(
    serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    headers = {"authorization": f"Bearer {gw_dirs[2]['qa']}", "idempotency-key": "serve-k1"}
    body = {"model": "auto", "messages": [{"role": "user", "content": "once please"}]}

    def post(_: int) -> httpx.Response:
        return httpx.post(f"{serve_gateway}/v1/chat/completions", json=body, headers=headers, timeout=60)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(post, range(16)))
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(upstreams.openai.received) == 1  # 16 requests, 2 replicas, one upstream call
    status = httpx.get(f"{serve_gateway}/healthz", timeout=30).json()
    assert status["ok"] is True


def test_idempotency_actor_outlives_a_replica(serve_gateway: str) -> None:
    """A new replica gets the same named, detached actor and sees completed keys."""
    import asyncio

    from switchyard.cluster.gateway_idempotency import ActorIdempotencyStore, shared_actor
    from switchyard.gateway.idempotency import StoredResponse

    async def run() -> None:
        first = ActorIdempotencyStore(shared_actor())
        assert (await first.claim("qa", "restart-k", "h")).outcome == "owner"
        await first.complete("qa", "restart-k", StoredResponse(200, {"id": "x"}, {}))
        again = ActorIdempotencyStore(shared_actor())  # what a restarted replica does
        claim = await again.claim("qa", "restart-k", "h")
        assert claim.outcome == "replay" and claim.response is not None and claim.response.body == {"id": "x"}

    asyncio.run(run())
