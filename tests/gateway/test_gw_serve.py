"""The Serve app on a real local Ray cluster: the OpenAI SDK over HTTP, the local model
through its handle, and the idempotency store shared by two replicas.

    flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/gateway/test_gw_serve.py
"""

from __future__ import annotations

import concurrent.futures
import json
import os
from pathlib import Path

import httpx
import openai
import pytest
from gw_fakes import PNG_DATA_URL, FakeUpstreams, Fault

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
    # Without a key, health says only that the replica is live and ready.
    assert httpx.get(f"{serve_gateway}/healthz", timeout=30).json() == {"live": True, "ready": True}


def test_idempotent_answers_outlive_every_replica(
    serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    """An answer the replicas stored is in the state's database, not in any process: a store
    opened afresh on it (what a restarted replica, or the CLI's erasure, opens) replays it."""
    import asyncio

    from switchyard.gateway.idempotency import body_fingerprint
    from switchyard.gateway.idempotency_sql import SqlIdempotencyStore

    upstreams.reset()
    raw = json.dumps({"model": "auto", "messages": [{"role": "user", "content": "keep me"}]}).encode()
    headers = {
        "authorization": f"Bearer {gw_dirs[2]['qa']}",
        "idempotency-key": "outlives-k1",
        "content-type": "application/json",
    }
    answered = httpx.post(f"{serve_gateway}/v1/chat/completions", content=raw, headers=headers, timeout=60)
    assert answered.status_code == 200, answered.text

    async def replayed() -> dict[str, object]:
        store = SqlIdempotencyStore.in_state_dir(Path(str(gw_dirs[1])))
        try:
            for _ in range(50):  # the answer is stored right after it is returned
                claim = await store.claim("qa", "outlives-k1", body_fingerprint("plain", raw))
                if claim.outcome == "replay":
                    assert claim.response is not None
                    return claim.response.body
                assert claim.outcome == "wait", claim
                await asyncio.sleep(0.1)
        finally:
            store.close()
        raise AssertionError("the stored answer never appeared in the database")

    assert asyncio.run(replayed())["id"] == answered.json()["id"]


EMAIL, PHONE, CARD = "jane.doe@example.com", "+1 415-555-0132", "4111 1111 1111 1111"


def test_personal_data_reaches_no_ray_log(
    serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    """The support flow's class redacts before sending and before storing. After a good
    request, a rejected one and one whose providers all fail, each carrying personal data,
    no raw value is in any file of the Ray session (every process's logs, Serve's request
    logs, the dashboard's), nor in what the provider received, nor in an error body."""
    upstreams.reset()
    upstreams.openai.reply = "We wrote to <EMAIL_ADDRESS_1>."
    text = f"My card {CARD} was charged twice; mail me at {EMAIL} or call {PHONE}."
    headers = {"authorization": f"Bearer {gw_dirs[2]['support']}", "x-switchyard-flow": "reply"}
    good = {"model": "auto", "messages": [{"role": "user", "content": text}], "variables": {"product": "X"}}
    with httpx.Client(base_url=serve_gateway, timeout=60) as http:
        answered = http.post("/v1/chat/completions", json=good, headers=headers)
        assert answered.status_code == 200, answered.text
        assert EMAIL in answered.json()["choices"][0]["message"]["content"]  # restored for the caller
        rejected = http.post(
            "/v1/chat/completions", json={**good, "variables": {"product": text * 3}}, headers=headers
        )  # over the schema's maxLength
        upstreams.openai.sticky = upstreams.anthropic.sticky = Fault("status", status=500)
        failed = http.post("/v1/chat/completions", json=good, headers=headers)
    sent = repr(upstreams.openai.received) + repr(upstreams.anthropic.received)
    upstreams.reset()
    assert rejected.status_code == 400 and failed.status_code >= 500
    raw = (EMAIL, PHONE, CARD)
    for response in (rejected, failed):
        assert not [v for v in raw if v in response.text], response.text
    assert "<EMAIL_ADDRESS_1>" in sent and not [v for v in raw if v in sent]
    session_root = Path(os.environ["RAY_TMPDIR"])
    files = [p for p in session_root.rglob("*") if p.is_file() and not p.is_symlink()]
    assert any(p.name.startswith("worker-") for p in files), "the session's logs are not where expected"
    leaks = [(str(p), v) for p in files for v in raw if v.encode() in _read(p)]
    assert leaks == []


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return b""  # rotated away while the test scanned


def test_killing_a_serve_replica_under_load_keeps_ledger_and_audit_reconciled(
    serve_gateway: str, gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    """One of the two gateway replicas is killed (`ray.kill`) under load; Serve starts a new
    one, which sends the dead replica's journaled charges and drains its audit spool before
    taking traffic. Meanwhile two clients stream answers and hang up after a chunk or two.
    Then, over the requests of this test: every answered request has exactly one audit record,
    every high-risk one too, every stream a client left has one, and the ledger's charges equal
    the audited costs request by request; a charge without a record is a request cut off by
    the kill."""
    import json
    import sqlite3
    import threading
    import time
    from contextlib import closing

    import ray
    from ray import serve
    from ray.util.state import list_actors

    from switchyard.audit.record import RequestRecord
    from switchyard.audit.store import AuditStore
    from switchyard.budgets.money import usd_to_nanos

    _, state, keys = gw_dirs
    upstreams.reset()
    upstreams.openai.reply = upstreams.anthropic.reply = json.dumps({"escalate": False, "reason": "routine"})
    calls = (
        ({"authorization": f"Bearer {keys['qa']}"}, BODY_PLAIN),
        ({"authorization": f"Bearer {keys['payments']}"}, BODY_DISPUTE),
    )
    started = time.time()
    answered: dict[str, str] = {}  # request id -> "high" / "medium", every 200 a client received
    stop = threading.Event()

    def user(n: int) -> None:
        with httpx.Client(base_url=serve_gateway, timeout=30) as http:
            i = n
            while not stop.is_set():
                headers, body = calls[i % 2]
                i += 1
                try:
                    r = http.post("/v1/chat/completions", json=body, headers=headers)
                except httpx.TransportError:
                    continue  # the connection went with the replica
                if r.status_code == 200:
                    answered[r.headers["x-switchyard-request-id"]] = "high" if i % 2 == 0 else "medium"

    streamed: set[str] = set()  # request ids of streams whose client hung up

    def streamer(n: int) -> None:
        body = {**BODY_PLAIN, "stream": True}
        with httpx.Client(base_url=serve_gateway, timeout=30) as http:
            while not stop.is_set():
                try:
                    with http.stream(
                        "POST", "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {keys['qa']}"}
                    ) as r:
                        if r.status_code != 200:
                            continue
                        for _ in zip(range(1 + n % 2), r.iter_raw(), strict=False):
                            pass  # a chunk or two, then the client hangs up
                        streamed.add(r.headers["x-switchyard-request-id"])
                except httpx.TransportError:
                    continue

    threads = [threading.Thread(target=user, args=(n,)) for n in range(6)]
    threads += [threading.Thread(target=streamer, args=(n,)) for n in range(2)]
    for t in threads:
        t.start()
    try:
        deadline = time.monotonic() + 60
        while len(answered) < 60 and time.monotonic() < deadline:
            time.sleep(0.05)
        victim = next(
            a
            for a in list_actors(filters=[("state", "=", "ALIVE")], detail=True)
            if a.class_name.startswith("ServeReplica:gateway:gateway")
        )
        ray.kill(ray.get_actor(victim.name, namespace="serve"), no_restart=True)
        after_kill = len(answered)
        while len(answered) < after_kill + 60 and time.monotonic() < deadline + 60:
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()

    def running_replicas() -> int:
        return int(serve.status().applications["gateway"].deployments["gateway"].replica_states.get("RUNNING", 0))

    # Serve's status lags the kill: for a moment it still counts the victim RUNNING (a CI run
    # read 2, then 1). So first see the victim gone, then its replacement RUNNING.
    noticed_by = time.monotonic() + 30
    while running_replicas() == 2 and time.monotonic() < noticed_by:
        time.sleep(0.2)
    deadline = time.monotonic() + 120
    while running_replicas() < 2 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert running_replicas() == 2, "Serve did not replace the killed replica"
    store = AuditStore.in_state_dir(state)
    ledger_db = state / "ledger.db"

    def reconcile() -> tuple[dict[str, int], dict[str, int], dict[str, str]]:
        records = [e.entry for e in store.find(since=started - 1, limit=100_000)]
        ids = [r.request_id for r in records if isinstance(r, RequestRecord)]
        assert len(ids) == len(set(ids)), "a request has two records"
        audited = {
            r.request_id: usd_to_nanos(r.cost_usd)
            for r in records
            if isinstance(r, RequestRecord) and (r.status_code == 200 or r.request_id in streamed)
        }
        with closing(sqlite3.connect(ledger_db)) as db:
            rows = db.execute("SELECT charge_id, nanos FROM charges WHERE at >= ?", (started - 1,)).fetchall()
        charged: dict[str, int] = {}
        for charge_id, nanos in rows:  # a request's bills: <id>, <id>.2, ...
            charged[charge_id.split(".")[0]] = charged.get(charge_id.split(".")[0], 0) + nanos
        missing = {
            rid: tier for rid, tier in {**answered, **dict.fromkeys(streamed, "stream")}.items() if rid not in audited
        }
        return audited, charged, missing

    deadline = time.monotonic() + 30  # the survivor's spool drains and its charges flush in the background
    while True:
        audited, charged, missing = reconcile()
        if (not missing and all(charged.get(r) == n for r, n in audited.items())) or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert missing == {}, f"{len(missing)} answered requests have no record"
    assert sum(t == "high" for t in answered.values()) >= 5
    assert len(streamed) >= 5, "too few streams were cut off to test them"
    assert {rid: charged.get(rid) for rid in audited} == audited, "an audited request's charge is missing or differs"
    cut_off = set(charged) - set(audited)
    # A request in flight on the killed replica (at its provider, or a stream before its first
    # byte) is charged its reservation from the journal and has no record: one per client at most.
    assert not cut_off & set(answered) and len(cut_off) <= len(threads)
    assert store.verify() == []
    print(f"\nserve kill: {len(answered)} answered, {len(audited)} audited, {len(cut_off)} cut-off charges")


BODY_PLAIN = {"model": "auto", "messages": [{"role": "user", "content": "Summarise my last three orders."}]}
BODY_DISPUTE = {"model": "auto", "messages": [], "variables": {"dispute_id": "D-7", "summary": "charged twice"}}


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def test_tool_loop_parse_and_images_through_serve(
    serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    """The SDK features product code uses, against the gateway on Serve (2 replicas): a tool
    loop plain and streamed (the SDK's stream helper assembles the calls), `parse` with a
    pydantic model, and an image for a vision model."""
    from pydantic import BaseModel

    upstreams.reset()
    sdk = client(serve_gateway, gw_dirs[2]["qa"])
    agent = {"X-Switchyard-Flow": "agent"}
    ask = [{"role": "user", "content": "Weather in Paris?"}]
    upstreams.openai.faults.append(Fault("tool_calls", calls=[("get_weather", {"city": "Paris"})]))
    first = sdk.chat.completions.create(model="auto", messages=ask, tools=[WEATHER], extra_headers=agent)
    call = (first.choices[0].message.tool_calls or [])[0]
    upstreams.openai.reply = "21 °C"
    result = {"role": "tool", "tool_call_id": call.id, "content": '{"temp_c": 21}'}
    second = sdk.chat.completions.create(
        model="auto",
        messages=[*ask, first.choices[0].message, result],
        tools=[WEATHER],
        extra_headers=agent,
    )
    assert second.choices[0].message.content == "21 °C"
    upstreams.openai.faults.append(Fault("tool_calls", calls=[("get_weather", {"city": "Lyon"})]))
    with sdk.chat.completions.stream(model="auto", messages=ask, tools=[WEATHER], extra_headers=agent) as stream:
        final = stream.get_final_completion()
    assert json.loads((final.choices[0].message.tool_calls or [])[0].function.arguments) == {"city": "Lyon"}

    class Weather(BaseModel):
        city: str
        temp_c: float

    upstreams.openai.reply = '{"city": "Paris", "temp_c": 21}'
    parsed = sdk.chat.completions.parse(model="auto", messages=ask, response_format=Weather)
    assert parsed.choices[0].message.parsed == Weather(city="Paris", temp_c=21)

    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": PNG_DATA_URL}}]}]
    raw = sdk.chat.completions.with_raw_response.create(
        model="auto",
        messages=image,
        extra_headers={"X-Switchyard-Flow": "vision"},
    )
    assert raw.headers["x-switchyard-provider"] == "bedrock" and raw.headers["x-request-id"]


def test_embeddings_through_serve(serve_gateway: str, gw_dirs: tuple[object, object, dict[str, str]]) -> None:
    """`client.embeddings.create` against the gateway on Serve, answered by the in-cluster
    model through its handle (a pooled hidden state of the local GPT)."""
    sdk = client(serve_gateway, gw_dirs[2]["qa"])
    raw = sdk.embeddings.with_raw_response.create(
        model="auto", input=["refund policy", "shipping times"], extra_headers={"X-Switchyard-Flow": "vectors"}
    )
    done = raw.parse()
    assert [len(d.embedding) for d in done.data] == [64, 64] and done.model == "local-embed"
    assert raw.headers["x-switchyard-provider"] == "local" and float(raw.headers["x-switchyard-cost-usd"]) > 0
    assert abs(sum(x * x for x in done.data[0].embedding) - 1.0) < 1e-4  # unit vectors
    assert done.usage.prompt_tokens > 0
