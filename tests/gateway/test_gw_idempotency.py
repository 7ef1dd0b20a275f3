"""Idempotency-Key: replay without a second upstream call or charge, 409 on a different
body, one upstream call for concurrent duplicates, and a store shared by two replicas."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from gw_fakes import FakeUpstreams, Fault
from gw_harness import Harness, build_harness

from switchyard.audit.sink import INLINE_BUILD_CHARS, open_sink
from switchyard.db.engine import Database, SqliteDatabase
from switchyard.gateway.idempotency import (
    CLAIM_TIMEOUT_S,
    Claim,
    IdempotencyTable,
    InMemoryIdempotencyStore,
    StoredResponse,
    check_claim_bound,
)
from switchyard.gateway.idempotency_sql import SCHEMA, SqlIdempotencyStore
from switchyard.gateway.planning import DEADLINE_HEADER
from switchyard.gateway.results import JSONResult
from switchyard.policy.models import MAX_DEADLINE_MS
from tests.shared_db import postgres_url, store_database

pytestmark = pytest.mark.asyncio(loop_scope="session")
BODY = {"model": "auto", "messages": [{"role": "user", "content": "charge me once"}]}


def headers(gw: Harness, key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {gw.keys['qa']}", "idempotency-key": key}


async def test_sequential_replay_does_not_call_or_charge_again(gw: Harness, upstreams: FakeUpstreams) -> None:
    http = gw.raw()
    first = await http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-seq"))
    second = await http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-seq"))
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json()
    assert second.headers["x-switchyard-idempotent-replay"] == "true"
    assert second.headers["x-switchyard-original-request-id"] == first.headers["x-switchyard-request-id"]
    assert len(upstreams.openai.received) == 1 and len(gw.budget.settled) == 1


async def test_a_duplicate_waiting_on_a_key_in_flight_is_504_at_its_deadline(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    """The store answers every poll at once; it is the first request that is slow. So the
    duplicate's answer at its deadline is 504 `deadline_exceeded` (the key is in flight), not a
    503 blaming the store, and comes by that deadline."""
    for slow in (upstreams.openai, upstreams.anthropic):  # the primary and its fallback
        slow.sticky = Fault("latency", delay_s=1.5)
    raw = json.dumps(BODY).encode()
    first = asyncio.ensure_future(gw.pipeline.handle(raw, headers(gw, "k-in-flight")))
    await asyncio.sleep(0.2)  # the first owns the key
    started = time.monotonic()
    duplicate = await gw.pipeline.handle(raw, {**headers(gw, "k-in-flight"), DEADLINE_HEADER: "700"})
    took = time.monotonic() - started
    assert isinstance(duplicate, JSONResult) and duplicate.status == 504, duplicate
    assert duplicate.body["error"]["code"] == "deadline_exceeded" and took < 1.0, (duplicate.body, took)
    await first  # answered or not, once: the duplicate made no call
    assert len(upstreams.openai.received) + len(upstreams.anthropic.received) <= 2


async def test_same_key_different_body_is_409(gw: Harness) -> None:
    http = gw.raw()
    assert (await http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-409"))).status_code == 200
    other = {**BODY, "messages": [{"role": "user", "content": "something else"}]}
    resp = await http.post("/v1/chat/completions", json=other, headers=headers(gw, "k-409"))
    assert resp.status_code == 409 and resp.json()["error"]["code"] == "idempotency_key_reused"


async def test_concurrent_duplicates_make_one_upstream_call(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.faults.append(Fault("latency", delay_s=0.3))
    http = gw.raw()
    responses = await asyncio.gather(
        *(http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-conc")) for _ in range(5))
    )
    assert {r.status_code for r in responses} == {200}
    assert len({r.json()["id"] for r in responses}) == 1
    assert len(upstreams.openai.received) == 1


async def test_failure_is_not_stored_so_a_retry_calls_again(gw: Harness, upstreams: FakeUpstreams) -> None:
    upstreams.openai.sticky = Fault("status", status=500)
    upstreams.anthropic.sticky = Fault("status", status=500)
    http = gw.raw()
    assert (await http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-fail"))).status_code == 502
    upstreams.openai.sticky = upstreams.anthropic.sticky = None
    assert (await http.post("/v1/chat/completions", json=BODY, headers=headers(gw, "k-fail"))).status_code == 200


async def test_two_replicas_share_one_store(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams
) -> None:
    upstreams.reset()
    policies, state, keys = gw_dirs
    shared = InMemoryIdempotencyStore(IdempotencyTable())
    a = build_harness(policies, state, keys, idempotency=shared)
    b = build_harness(policies, state, keys, idempotency=shared)
    try:
        hdr = {"authorization": f"Bearer {keys['qa']}", "idempotency-key": "k-replicas"}
        r1 = await a.raw().post("/v1/chat/completions", json=BODY, headers=hdr)
        r2 = await b.raw().post("/v1/chat/completions", json=BODY, headers=hdr)
        assert r1.json() == r2.json() and r2.headers["x-switchyard-idempotent-replay"] == "true"
        assert len(upstreams.openai.received) == 1
        assert not b.budget.settled  # replica b charged nothing
    finally:
        await a.aclose()
        await b.aclose()


async def test_table_ttl_and_crashed_owner() -> None:
    now = [0.0]
    table = IdempotencyTable(ttl_s=10, claim_timeout_s=5, clock=lambda: now[0])
    assert table.claim("t", "k", "h").outcome == "owner"
    assert table.claim("t", "k", "h").outcome == "wait"
    now[0] = 6  # the owner crashed without completing: its claim lapses
    assert table.claim("t", "k", "h").outcome == "owner"
    assert table.claim("u", "k", "h").outcome == "owner"  # keys are scoped per team


async def test_streaming_with_a_key_is_refused(gw: Harness) -> None:
    resp = await gw.raw().post("/v1/chat/completions", json={**BODY, "stream": True}, headers=headers(gw, "k-stream"))
    assert resp.status_code == 400
    _ = httpx  # the raw client is httpx


async def test_a_claim_outlives_the_longest_request_and_the_storing_of_its_answer() -> None:
    """An owner's claim must not lapse while its request runs (up to the longest deadline any
    policy set may give, `MAX_DEADLINE_MS`) or while its answer waits to be stored: a retry
    would run, and be charged, again. The gateway's store checks it when it opens."""
    check_claim_bound(CLAIM_TIMEOUT_S, MAX_DEADLINE_MS / 1000)
    with pytest.raises(ValueError, match=r"claim_timeout_s=130 must be at least .* = 151.75"):
        check_claim_bound(130.0, MAX_DEADLINE_MS / 1000)


async def test_a_client_that_hangs_up_and_retries_with_its_key_pays_once(gw: Harness, upstreams: FakeUpstreams) -> None:
    """Stop 48: a client that timed out waiting and retried with the same Idempotency-Key (what
    the key is for) paid twice. Its hang-up cancelled the upstream call (charged what it may
    have cost: the bound) and freed the key, so the retry called the provider again. Now the
    owner's call runs on in a task the gateway owns, its answer is stored, and the retry
    waits for it and replays it: one upstream call, one charge, one audit record."""
    upstreams.openai.faults.append(Fault("latency", delay_s=0.3))
    key = headers(gw, "k-hang-up")
    raw = json.dumps(BODY).encode()  # the same bytes both times, as a client's retry sends them
    first = asyncio.create_task(gw.pipeline.handle(raw, key))
    await asyncio.sleep(0.1)  # the upstream call is in flight
    first.cancel()  # as Serve does when the client disconnects
    with pytest.raises(asyncio.CancelledError):
        await first
    retry = await gw.raw().post(
        "/v1/chat/completions", content=raw, headers={**key, "content-type": "application/json"}
    )
    assert retry.status_code == 200 and retry.headers["x-switchyard-idempotent-replay"] == "true"
    assert len(upstreams.openai.received) == 1
    assert len(gw.budget.settled) == 1
    [record] = [x for x in gw.audit.exchanges if x.ctx.idempotency_key == "k-hang-up"]
    assert record.status_code == 200


class SlowClaims(SqlIdempotencyStore):
    """The durable store on a database that takes 0.2 s per claim: a claim is still being made
    (in the store's worker thread, which a cancelled caller does not stop) after its client
    has gone."""

    def _claim(self, scope: str, key: str, body_hash: str) -> Claim:
        time.sleep(0.2)
        return super()._claim(scope, key, body_hash)


async def test_a_client_that_hangs_up_while_its_key_is_claimed_does_not_block_its_retry(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path
) -> None:
    """Stop 48: a client that hung up while its key was being claimed left the claim made
    (the store's transaction runs on) and owned by no one: its retry waited on it until its
    own deadline (504), and would have until the claim lapsed (5 minutes). Now the claim is
    freed once made, and the retry runs."""
    upstreams.reset()
    policies, state, keys = gw_dirs
    store = SlowClaims(SqliteDatabase(tmp_path / "idempotency.db"))
    h = build_harness(policies, state, keys, idempotency=store)
    try:
        hdr = {"authorization": f"Bearer {keys['qa']}", "idempotency-key": "k-claiming", DEADLINE_HEADER: "2000"}
        raw = json.dumps(BODY).encode()
        first = asyncio.create_task(h.pipeline.handle(raw, hdr))
        await asyncio.sleep(0.1)  # inside the claim
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
        await asyncio.sleep(0.2)  # the claim is made by now
        retry = await h.pipeline.handle(raw, hdr)
        assert retry.status == 200, retry
        assert len(upstreams.openai.received) == 1
    finally:
        await h.aclose()
        store.close()


@contextmanager
def a_stuck_writer(backend: str, db: Database) -> Iterator[None]:
    """Another session holds the idempotency table's write lock and does not go on, as a replica
    stopped mid-transaction (a long GC pause, a paused VM) or an operator's open session does.
    SQLite makes a writer wait `BUSY_TIMEOUT_S` for it; Postgres, for as long as it is held."""
    if backend == "sqlite":
        assert isinstance(db, SqliteDatabase)
        holder: Any = sqlite3.connect(db.path, isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:
        holder = psycopg.connect(postgres_url(), autocommit=True)
        holder.execute("BEGIN")
        holder.execute("LOCK TABLE idempotency_entries IN EXCLUSIVE MODE")
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


async def test_a_keyed_request_whose_store_is_stuck_is_answered_by_its_deadline(
    backend: str, gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path
) -> None:
    """Stop 49: the claim of a key waited on the store with no bound. Behind a writer that did
    not go on, a request with a 2 s deadline was answered after SQLite's 10 s busy timeout, and
    on Postgres not at all while the lock was held. Now the store gets until the deadline: then
    503 (nothing was run), and the claim, if it is made later, is freed for the retry."""
    upstreams.reset()
    policies, state, keys = gw_dirs
    db = store_database(backend, tmp_path / "idempotency.db", SCHEMA)
    store = SqlIdempotencyStore(db)
    h = build_harness(policies, state, keys, idempotency=store)
    hdr = {"authorization": f"Bearer {keys['qa']}", "idempotency-key": "k-stuck", DEADLINE_HEADER: "2000"}
    raw = json.dumps(BODY).encode()
    try:
        with a_stuck_writer(backend, db):
            started = time.monotonic()
            try:
                stuck = await asyncio.wait_for(h.pipeline.handle(raw, hdr), timeout=8)
            except TimeoutError:
                pytest.fail("a keyed request waited on a stuck idempotency store past its deadline, 8 s and on")
            took = time.monotonic() - started
        assert isinstance(stuck, JSONResult) and stuck.status == 503, stuck
        assert stuck.body["error"]["code"] == "idempotency_unavailable", stuck.body
        assert took < 3.0, took  # its 2 s deadline, and no more than a second's slack
        assert len(upstreams.openai.received) == 0  # not run: the key was never claimed in time
        retry = await h.pipeline.handle(raw, hdr)
        assert retry.status == 200, retry  # the claim made once the writer let go was freed
        assert len(upstreams.openai.received) == 1
    finally:
        await h.aclose()
        store.close()


class SlowAnswers(SqlIdempotencyStore):
    """The durable store on a database that takes 4 s to store an answer."""

    def _complete(self, scope: str, key: str, response: StoredResponse) -> None:
        time.sleep(4)
        super()._complete(scope, key, response)


async def test_an_answer_does_not_wait_past_its_deadline_for_a_slow_store(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path
) -> None:
    """Stop 49: the answer of a keyed request waited for its storing with no bound (4 s here,
    past a 2 s deadline). Now it goes out by the deadline, is stored meanwhile, and a retry
    replays it."""
    upstreams.reset()
    policies, state, keys = gw_dirs
    store = SlowAnswers(SqliteDatabase(tmp_path / "idempotency.db"))
    h = build_harness(policies, state, keys, idempotency=store)
    hdr = {"authorization": f"Bearer {keys['qa']}", "idempotency-key": "k-slow-store", DEADLINE_HEADER: "2000"}
    raw = json.dumps(BODY).encode()
    try:
        started = time.monotonic()
        answer = await h.pipeline.handle(raw, hdr)
        took = time.monotonic() - started
        assert answer.status == 200 and took < 3.0, (answer, took)
        patient = {**hdr, DEADLINE_HEADER: "10000"}
        retry = await h.pipeline.handle(raw, patient)  # waits on the claim until the answer is stored
        assert retry.status == 200 and retry.headers.get("x-switchyard-idempotent-replay") == "true", retry
        assert len(upstreams.openai.received) == 1
    finally:
        await h.aclose()
        store.close()


async def test_a_stuck_idempotency_store_holds_up_no_other_request(
    backend: str, gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path
) -> None:
    """Stop 49: each claim waiting on the store held one of the event loop's default worker
    threads (asyncio's, min(32, CPUs + 4)). Once keyed requests held them all, every other
    request waited for one too: the audit record of a large or redacted request (or of any
    request, with the keyring on Postgres) is built there. Now the store has a worker of its own."""
    upstreams.reset()
    policies, state, keys = gw_dirs
    db = store_database(backend, tmp_path / "idempotency.db", SCHEMA)
    store = SqlIdempotencyStore(db)
    h = build_harness(policies, state, keys, idempotency=store)
    sink = await open_sink(tmp_path / "audit-state", lambda: h.store.current.data)  # the real one
    h.parts.audit = sink
    default_workers = min(32, (os.cpu_count() or 1) + 4)  # `ThreadPoolExecutor`'s default size
    raw = json.dumps(BODY).encode()
    large = {**BODY, "messages": [{"role": "user", "content": "a long question " * (INLINE_BUILD_CHARS // 16 + 1)}]}
    plain_hdr = {"authorization": f"Bearer {keys['qa']}", DEADLINE_HEADER: "3000"}
    try:
        with a_stuck_writer(backend, db):
            keyed = [
                asyncio.create_task(h.pipeline.handle(raw, {**plain_hdr, "idempotency-key": f"k-held-{i}"}))
                for i in range(default_workers)
            ]
            await asyncio.sleep(0.5)  # every claim is waiting on the store
            started = time.monotonic()
            try:
                plain = await asyncio.wait_for(h.pipeline.handle(json.dumps(large).encode(), plain_hdr), timeout=8)
            except TimeoutError:
                pytest.fail(f"a request without a key waited behind {default_workers} stuck claims, 8 s and on")
            took = time.monotonic() - started
            assert plain.status == 200 and took < 3.0, (plain, took)
            assert {answer.status for answer in await asyncio.gather(*keyed)} == {503}
    finally:
        await sink.close()
        await h.aclose()
        store.close()


class CountedClaims(SqlIdempotencyStore):
    """The durable store, counting the claim transactions it runs (on its one worker)."""

    made = 0

    def _claim(self, scope: str, key: str, body_hash: str) -> Claim:
        self.made += 1
        return super()._claim(scope, key, body_hash)


async def test_claims_given_up_on_are_not_made_when_the_store_comes_back(
    gw_dirs: tuple[Path, Path, dict[str, str]], upstreams: FakeUpstreams, tmp_path: Path
) -> None:
    """Stop 49: behind a stuck writer, every keyed request queued a claim on the store's worker,
    and gave up at its deadline (503). Each queued claim was still made once the writer let go,
    and then freed: a backlog of two transactions per request given up, which the requests
    arriving after the store came back waited behind. Now a claim whose request gave up before
    it started is withdrawn; only the one under way is made, and freed."""
    upstreams.reset()
    policies, state, keys = gw_dirs
    store = CountedClaims(SqliteDatabase(tmp_path / "idempotency.db"))
    h = build_harness(policies, state, keys, idempotency=store)
    raw = json.dumps(BODY).encode()
    given_up = 60
    try:
        with a_stuck_writer("sqlite", store.db):
            answers = await asyncio.gather(
                *(
                    h.pipeline.handle(raw, {**headers(h, f"k-backlog-{i}"), DEADLINE_HEADER: "500"})
                    for i in range(given_up)
                )
            )
            assert {a.status for a in answers} == {503}
        started = time.monotonic()
        fresh = await h.pipeline.handle(raw, {**headers(h, "k-after"), DEADLINE_HEADER: "5000"})
        took = time.monotonic() - started
        assert fresh.status == 200, fresh
        assert store.made == 2, (store.made, took)  # the claim under way when they gave up, and the fresh one
    finally:
        await h.aclose()
        store.close()
