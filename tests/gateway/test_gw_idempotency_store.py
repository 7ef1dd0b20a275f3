"""The durable idempotency store (`SqlIdempotencyStore`) on SQLite and Postgres: the protocol's
outcomes, one owner among concurrent claimants on separate connections, answers that outlive
the store instance, and (Postgres) a server restart between a completion and its replay.

`test_replay_across_a_postgres_server_restart` restarts the shared test server
(`scripts/postgres.sh restart`, ~1 s): connections other tests hold at that moment are cut.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from switchyard.db.engine import Database, Dialect, Result, open_database
from switchyard.gateway.idempotency import IdempotencyUnavailable, StoredResponse
from switchyard.gateway.idempotency_sql import SCHEMA, SqlIdempotencyStore
from tests.shared_db import fresh_postgres, postgres_url, store_database
from tests.skewed_host import on_a_skewed_host

REPO = Path(__file__).resolve().parents[2]
SEED_ENV = "SWITCHYARD_IDEMPOTENCY_SEED"
KEYS = 40
ANSWER = StoredResponse(
    200,
    {"id": "chatcmpl-1", "choices": [{"message": {"content": "héllo \u0000 ✓"}}], "usage": {"cost": 0.1 + 0.2}},
    {"x-switchyard-request-id": "r-1", "content-type": "application/json"},
    subject="ps-alice",
)


class FakeClock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def database(backend: str, tmp_path: Path) -> Iterator[Database]:
    db = store_database(backend, tmp_path / "idempotency.db", SCHEMA)
    yield db
    db.close()


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def store_on(db: Database, clock: FakeClock, **kw: Any) -> SqlIdempotencyStore:
    return SqlIdempotencyStore(db, ttl_s=100.0, claim_timeout_s=5.0, clock=clock, **kw)


def count(db: Database, table: str) -> int:
    with db.read() as tx:
        row = tx.execute(f"SELECT COUNT(*) FROM {table}").one()
    assert row is not None
    return int(row[0])


# ------------------------------------------------------------ the protocol


async def test_owner_wait_replay_and_conflict(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)
    assert (await store.claim("t", "k", "h")).outcome == "owner"
    assert (await store.claim("t", "k", "h")).outcome == "wait"
    assert (await store.claim("t", "k", "other")).outcome == "conflict"
    assert (await store.claim("u", "k", "h")).outcome == "owner"  # keys are scoped per team
    await store.complete("t", "k", ANSWER)
    replay = await store.claim("t", "k", "h")
    assert replay.outcome == "replay" and replay.response == ANSWER
    assert (await store.claim("t", "k", "other")).outcome == "conflict"


async def test_answers_round_trip_exactly(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)
    answers = {
        "full": ANSWER,
        "anonymous": StoredResponse(201, {}, {}, subject=None),
        "nested": StoredResponse(200, {"a": [1, 2.5, None, True, {"b": "ü" * 300}], "n": 2**53}, {"h": ""}),
    }
    for key, answer in answers.items():
        assert (await store.claim("t", key, "h")).outcome == "owner"
        await store.complete("t", key, answer)
    for key, answer in answers.items():
        replayed = (await store.claim("t", key, "h")).response
        assert replayed == answer and replayed is not None
        assert type(replayed.status) is int and list(replayed.body) == list(answer.body)  # order kept


async def test_a_crashed_owners_claim_lapses(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)  # claim timeout 5 s
    assert (await store.claim("t", "k", "h")).outcome == "owner"
    clock.now += 5
    assert (await store.claim("t", "k", "h")).outcome == "wait"  # not yet: the timeout is "more than"
    clock.now += 1
    assert (await store.claim("t", "k", "h")).outcome == "owner"
    assert (await store.claim("t", "k", "h")).outcome == "wait"  # the new owner's claim is fresh


async def test_abandon_frees_a_claim_but_never_an_answer(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)
    await store.abandon("t", "never-claimed")
    assert (await store.claim("t", "k", "h")).outcome == "owner"
    await store.abandon("t", "k")
    assert (await store.claim("t", "k", "h")).outcome == "owner"  # a retry runs again
    await store.complete("t", "k", ANSWER)
    await store.abandon("t", "k")
    assert (await store.claim("t", "k", "h")).response == ANSWER


async def test_complete_without_a_claim_stores_nothing(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)
    await store.complete("t", "k", ANSWER)
    assert (await store.claim("t", "k", "h")).outcome == "owner"


async def test_purge_deletes_a_subjects_answers_and_drops_its_late_completions(
    database: Database, clock: FakeClock
) -> None:
    store = store_on(database, clock)
    bob = StoredResponse(200, {"answer": "kept"}, {}, subject="ps-bob")
    for scope, key, answer in (("t", "a1", ANSWER), ("t", "a2", ANSWER), ("t", "b", bob), ("u", "a", ANSWER)):
        assert (await store.claim(scope, key, "h")).outcome == "owner"
        await store.complete(scope, key, answer)
    assert (await store.claim("t", "in-flight", "h")).outcome == "owner"

    assert await store.purge_subject("t", "ps-alice") == 2
    assert (await store.claim("t", "a1", "h")).outcome == "owner"  # runs again; nothing replayed
    assert (await store.claim("t", "b", "h")).response == bob
    assert (await store.claim("u", "a", "h")).response == ANSWER  # another team's answer stays
    # In flight during the purge, completed after it with the erased pseudonym: dropped.
    await store.complete("t", "in-flight", ANSWER)
    assert (await store.claim("t", "in-flight", "h")).outcome == "owner"
    assert await store.purge_subject("t", "ps-alice") == 0

    clock.now += 100  # the marker lasts one TTL (100 s): after it, the subject's answers are kept
    assert (await store.claim("t", "late", "h")).outcome == "owner"  # this claim's sweep drops the marker
    assert count(database, "idempotency_erasures") == 0
    await store.complete("t", "late", ANSWER)
    assert (await store.claim("t", "late", "h")).response == ANSWER


async def test_answers_expire_after_the_ttl_by_an_amortised_sweep(database: Database, clock: FakeClock) -> None:
    recorded = RecordingDatabase(database)
    store = store_on(recorded, clock, sweep_every_s=30.0)  # TTL 100 s
    assert (await store.claim("t", "k", "h")).outcome == "owner"  # the first claim sweeps
    await store.complete("t", "k", ANSWER)  # kept until 1100
    clock.now = 1090
    assert (await store.claim("t", "x", "h")).outcome == "owner"  # a sweep (due since 1030); next at 1120
    recorded.statements.clear()
    clock.now = 1100  # expired, but kept at least the TTL: replayed until the next sweep
    for key in ("k", "y", "z", "k"):
        await store.claim("t", key, "h")
    assert (await store.claim("t", "k", "h")).response == ANSWER
    assert not [sql for sql in recorded.statements if sql.startswith("DELETE")]  # no sweep per request
    clock.now = 1120
    assert (await store.claim("t", "k", "h")).outcome == "owner"
    assert [sql.split(" WHERE")[0] for sql in recorded.statements if sql.startswith("DELETE")] == [
        "DELETE FROM idempotency_entries",
        "DELETE FROM idempotency_erasures",
    ]


async def test_database_errors_are_unavailable_naming_the_store(database: Database, clock: FakeClock) -> None:
    store = store_on(database, clock)
    database.outside_transaction("DROP TABLE idempotency_entries")
    with pytest.raises(IdempotencyUnavailable, match="idempotency store at"):
        await store.claim("t", "k", "h")
    with pytest.raises(IdempotencyUnavailable, match="idempotency store at"):
        await store.complete("t", "k", ANSWER)


async def test_database_calls_run_off_the_event_loop(database: Database) -> None:
    threads: list[int] = []

    def clock() -> float:  # called inside each operation's transaction
        threads.append(threading.get_ident())
        return time.time()

    store = SqlIdempotencyStore(database, clock=clock)
    await store.claim("t", "k", "h")
    await store.complete("t", "k", ANSWER)
    assert threads and threading.get_ident() not in threads


# ------------------------------------------------------------ concurrency


@pytest.mark.parametrize("taken", ["new", "lapsed"])
def test_one_of_many_concurrent_claimants_becomes_the_owner(database: Database, clock: FakeClock, taken: str) -> None:
    """Twelve claimants at once, each on its own connection (as replicas are), of a key never
    claimed (the primary key decides) or of one whose owner crashed (the row lock decides)."""
    if taken == "lapsed":
        assert asyncio.run(store_on(database, clock).claim("t", "contended", "h")).outcome == "owner"
        clock.now += 6  # past the 5 s claim timeout
    claimants = 12
    start = threading.Barrier(claimants)
    stores = [store_on(open_database(database.url), clock) for _ in range(claimants)]

    async def claim_with_the_others(store: SqlIdempotencyStore) -> str:
        # A first claim elsewhere sweeps (the sweep's lock would serialise the claims below) and
        # starts this loop's worker thread; then all claim at once.
        await store.claim("t", f"warm-up-{id(store)}", "h")
        await asyncio.to_thread(start.wait)
        return (await store.claim("t", "contended", "h")).outcome

    def claim(store: SqlIdempotencyStore) -> str:
        return asyncio.run(claim_with_the_others(store))

    try:
        with ThreadPoolExecutor(claimants) as pool:
            outcomes = sorted(pool.map(claim, stores))
    finally:
        for store in stores:
            store.close()
    assert outcomes == ["owner"] + ["wait"] * (claimants - 1)


class OwnershipLog:
    """What the claimants saw, checked as they go: one owner per key at a time, one answer per key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.owner: dict[str, int] = {}
        self.answer: dict[str, StoredResponse] = {}
        self.outcomes: Counter[str] = Counter()

    def became_owner(self, key: str, worker: int) -> None:
        with self._lock:
            assert key not in self.owner, f"{key}: worker {worker} became owner while {self.owner[key]} was"
            assert key not in self.answer, f"{key}: worker {worker} became owner of a completed key"
            self.owner[key] = worker

    def released(self, key: str, answer: StoredResponse | None) -> None:
        # Before the store is told: no one else can be owner until the store has been.
        with self._lock:
            del self.owner[key]
            if answer is not None:
                self.answer[key] = answer

    def replayed(self, key: str, response: StoredResponse | None) -> None:
        with self._lock:
            assert response is not None and response == self.answer.get(key), f"{key}: replayed {response}"


async def claimant(store: SqlIdempotencyStore, worker: int, rng: random.Random, log: OwnershipLog) -> None:
    keys = [f"k{i}" for i in range(KEYS)]
    for step in range(150):
        key = rng.choice(keys)
        claim = await store.claim("t", key, f"body-{key}")
        log.outcomes[claim.outcome] += 1
        if claim.outcome == "replay":
            log.replayed(key, claim.response)
        assert claim.outcome != "conflict", f"{key}: conflict for the same body"
        if claim.outcome != "owner":
            continue
        log.became_owner(key, worker)
        await asyncio.sleep(rng.choice((0.0, 0.0, 0.001, 0.003)))  # the upstream call
        if rng.random() < 0.85:  # mostly abandoned, so each key is owned many times over
            log.released(key, None)
            await store.abandon("t", key)
        else:
            answer = StoredResponse(200, {"by": worker, "step": step}, {"x-worker": str(worker)}, subject=None)
            log.released(key, answer)
            await store.complete("t", key, answer)


def test_randomized_claims_keep_one_owner_and_one_answer_per_key(database: Database) -> None:
    """Six replicas (threads, each its own connection) claim, abandon and complete 40 keys in a
    seeded random order; the interleaving is the scheduler's. On failure, pytest shows the seed."""
    seed = int(os.environ.get(SEED_ENV) or random.randrange(2**32))
    print(f"seed {seed}: rerun with {SEED_ENV}={seed}")
    workers = 6
    log = OwnershipLog()
    # A claim timeout no run reaches: every owner here is alive, so ownership never lapses.
    stores = [SqlIdempotencyStore(open_database(database.url), claim_timeout_s=3600) for _ in range(workers + 1)]

    def run(worker: int) -> None:
        asyncio.run(claimant(stores[worker], worker, random.Random(seed * 100 + worker), log))

    try:
        with ThreadPoolExecutor(workers) as pool:
            for future in [pool.submit(run, w) for w in range(workers)]:
                future.result()
        fresh = stores[workers]  # a store that took no part: it replays every answer
        for key, answer in log.answer.items():
            assert asyncio.run(fresh.claim("t", key, f"body-{key}")).response == answer
    finally:
        for store in stores:
            store.close()
    print(dict(log.outcomes))
    assert log.outcomes["owner"] > KEYS and log.outcomes["wait"] and log.outcomes["replay"]


# ------------------------------------------------------------ replicas on hosts whose clocks disagree

# A gateway replica on another host (`on_a_skewed_host`): it claims the keys named on its
# command line.
_REPLICA_CLAIMS = """
import asyncio, json, sys
from switchyard.db.engine import open_database
from switchyard.gateway.idempotency_sql import SqlIdempotencyStore
store = SqlIdempotencyStore(open_database(sys.argv[1]))
async def claims():
    return [(await store.claim("t", key, "h")).outcome for key in sys.argv[2:]]
print(json.dumps(asyncio.run(claims())))
store.close()
"""


def claims_on_a_skewed_host(url: str, skew_s: float, *keys: str) -> list[str]:
    outcomes: list[str] = json.loads(on_a_skewed_host(skew_s, _REPLICA_CLAIMS, url, *keys))
    return outcomes


@pytest.mark.parametrize("skew_s", [600.0, 2 * 86400.0, -600.0], ids=["10min-ahead", "2days-ahead", "10min-behind"])
def test_a_replica_whose_clock_is_off_takes_over_no_claim_and_sweeps_no_answer(
    database: Database, skew_s: float
) -> None:
    """Stop 48: claims lapsed, and answers expired, by the wall clock of whichever replica
    looked. A replica 10 minutes ahead took over a request still in flight on another (a second
    upstream call, charged twice); 2 days ahead, its first claim swept every stored answer; 10
    minutes behind, its own claims looked lapsed to every other replica at once."""
    here = SqlIdempotencyStore(open_database(database.url))  # the default: as the gateway opens it
    try:
        assert asyncio.run(here.claim("t", "in-flight-here", "h")).outcome == "owner"
        assert asyncio.run(here.claim("t", "answered", "h")).outcome == "owner"
        asyncio.run(here.complete("t", "answered", ANSWER))
        there = claims_on_a_skewed_host(database.url, skew_s, "in-flight-here", "answered", "in-flight-there")
        assert there == ["wait", "replay", "owner"]
        assert asyncio.run(here.claim("t", "in-flight-there", "h")).outcome == "wait"
        assert asyncio.run(here.claim("t", "answered", "h")).response == ANSWER
    finally:
        here.close()


# ------------------------------------------------------------ durability


async def test_an_answer_survives_a_restart_of_the_store(database: Database, clock: FakeClock) -> None:
    before = store_on(open_database(database.url), clock)
    assert (await before.claim("t", "done", "h")).outcome == "owner"
    await before.complete("t", "done", ANSWER)
    assert (await before.claim("t", "pending", "h")).outcome == "owner"
    before.close()  # the process that held it is gone

    after = store_on(open_database(database.url), clock)
    try:
        assert (await after.claim("t", "done", "h")).response == ANSWER
        assert (await after.claim("t", "pending", "h")).outcome == "wait"  # its claim too, until it lapses
    finally:
        after.close()


@pytest.fixture
def restarts_shared_postgres() -> Callable[[], None]:
    """Restarts the test server (every test's Postgres): `scripts/postgres.sh restart`."""
    port = urlsplit(postgres_url()).port
    if port != int(os.environ.get("SWITCHYARD_PG_PORT", "25432")):
        pytest.fail(f"$SWITCHYARD_TEST_POSTGRES_URL (port {port}) is not the server scripts/postgres.sh runs")

    def restart() -> None:
        done = subprocess.run(
            ["bash", str(REPO / "scripts" / "postgres.sh"), "restart"], capture_output=True, text=True, timeout=200
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == ""

    return restart


def server_started_at() -> object:
    probe = open_database(postgres_url())
    try:
        with probe.read() as tx:
            row = tx.execute("SELECT pg_postmaster_start_time()").one()
    finally:
        probe.close()
    assert row is not None
    return row[0]


def backend_pid(db: Database) -> int:
    with db.read() as tx:
        row = tx.execute("SELECT pg_backend_pid()").one()
    assert row is not None
    return int(row[0])


async def test_replay_across_a_postgres_server_restart(restarts_shared_postgres: Callable[[], None]) -> None:
    """The store's connection breaks under it; the next operation's BEGIN fails, the database
    reconnects and runs it again (nothing of it had run), so the replay needs no retry."""
    db = fresh_postgres(SCHEMA)
    store = SqlIdempotencyStore(db)
    try:
        assert (await store.claim("t", "k", "h")).outcome == "owner"
        await store.complete("t", "k", ANSWER)
        started, connection = server_started_at(), backend_pid(db)
        restarts_shared_postgres()
        assert server_started_at() != started, "the server did not restart"
        assert (await store.claim("t", "k", "h")).response == ANSWER
        assert backend_pid(db) != connection  # it did reconnect
        assert (await store.claim("t", "new", "h")).outcome == "owner"
    finally:
        store.close()


# ------------------------------------------------------------ helpers


class RecordingTransaction:
    def __init__(self, tx: Any, statements: list[str]) -> None:
        self._tx = tx
        self._statements = statements

    def execute(self, sql: str, params: Any = ()) -> Result:
        self._statements.append(sql)
        result: Result = self._tx.execute(sql, params)
        return result

    def lock(self, name: str) -> None:
        self._tx.lock(name)


class RecordingDatabase:
    """A `Database` that records every statement its transactions run."""

    def __init__(self, db: Database) -> None:
        self._db = db
        self.url = db.url
        self.dialect: Dialect = db.dialect
        self.lock_rows = db.lock_rows
        self.clock_sql = db.clock_sql
        self.statements: list[str] = []

    @contextmanager
    def _recorded(self, scope: AbstractContextManager[Any]) -> Iterator[RecordingTransaction]:
        with scope as tx:
            yield RecordingTransaction(tx, self.statements)

    def transaction(self) -> AbstractContextManager[RecordingTransaction]:
        return self._recorded(self._db.transaction())

    def read(self) -> AbstractContextManager[RecordingTransaction]:
        return self._recorded(self._db.read())

    def outside_transaction(self, sql: str) -> None:
        self._db.outside_transaction(sql)

    def close(self) -> None:
        self._db.close()
