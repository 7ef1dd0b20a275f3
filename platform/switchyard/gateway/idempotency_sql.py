"""The idempotency store in the database every replica shares: stored answers outlive every process.

`idempotency_entries` holds one row per (scope, key): the claim, and once its owner is done, the
answer (status, body and headers as JSON text, the subject's pseudonym). `idempotency_erasures`
holds the purge markers. Each operation is one transaction that locks the key's row and applies
the decisions of `switchyard.gateway.idempotency` to it, so the in-memory table and this store
cannot drift, and of two replicas claiming one key at once the database makes one the owner
(SQLite: one writer at a time; Postgres: the row lock, or the primary key when the row is new).

Lock order on Postgres, so that no two operations deadlock: the subject's lock (a complete with
a subject, a purge), then the bulk lock (a sweep, a purge), then entry rows. Only the holders
of the bulk lock lock more than one row.

Time: claims lapse, answers expire and erasure markers end by the database's clock
(`Database.clock_sql`), read in each operation's transaction. Replicas on several hosts share
the store, and a replica whose clock ran ahead by more than the claim timeout (a resumed VM, a
host NTP has not reached) took over the claims of requests still in flight elsewhere, and so
ran and charged them twice; one ahead by more than the TTL swept every stored answer (stop 48).

Expiry: an answer is kept at least its TTL. At most once every `sweep_every_s` (per store), a
claim deletes the expired entries and markers by their expiry index, never a scan per request.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import math
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, ParamSpec, TypeVar

from switchyard.db.engine import Database, Transaction, database_errors, database_time, redacted
from switchyard.db.location import Store, open_store
from switchyard.db.migrations import Migration, Schema, prepare
from switchyard.gateway.idempotency import (
    ANSWER_TTL_S,
    CLAIM_TIMEOUT_S,
    Claim,
    IdempotencyEntry,
    IdempotencyUnavailable,
    StoredResponse,
    after_abandon,
    after_complete,
    check_claim_bound,
    decide_claim,
    erased_by,
    erasure_until,
)
from switchyard.policy.models import MAX_DEADLINE_MS

_V1 = (
    """CREATE TABLE IF NOT EXISTS idempotency_entries (
        scope      TEXT NOT NULL,
        key        TEXT NOT NULL,
        body_hash  TEXT NOT NULL,
        claimed_at DOUBLE PRECISION NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        status     INTEGER,
        body       TEXT,
        headers    TEXT,
        subject    TEXT,
        PRIMARY KEY (scope, key)
    )""",
    "CREATE INDEX IF NOT EXISTS idempotency_entries_expiry ON idempotency_entries (expires_at)",
    "CREATE INDEX IF NOT EXISTS idempotency_entries_subject ON idempotency_entries (scope, subject)",
    """CREATE TABLE IF NOT EXISTS idempotency_erasures (
        scope   TEXT NOT NULL,
        subject TEXT NOT NULL,
        until   DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (scope, subject)
    )""",
    "CREATE INDEX IF NOT EXISTS idempotency_erasures_expiry ON idempotency_erasures (until)",
)
SCHEMA = Schema("idempotency", (Migration(1, _V1),))

_COLUMNS = "body_hash, claimed_at, expires_at, status, body, headers, subject"
_BULK_LOCK = "idempotency:bulk"
# A claim decides again when another claimant inserted the key's row between its look and its
# insert; each round needs other transactions to commit on that key in between, so a few suffice.
_CLAIM_ROUNDS = 8

P = ParamSpec("P")
T = TypeVar("T")

log = logging.getLogger(__name__)


def _subject_lock(scope: str, subject: str) -> str:
    return f"idempotency:subject:{scope}:{subject}"


def _entry(row: tuple[Any, ...]) -> IdempotencyEntry:
    body_hash, claimed_at, expires_at, status, body, headers, subject = row
    response = None
    if status is not None:
        response = StoredResponse(int(status), json.loads(body), json.loads(headers), subject)
    return IdempotencyEntry(str(body_hash), float(claimed_at), float(expires_at), response)


def _values(entry: IdempotencyEntry) -> tuple[Any, ...]:
    r = entry.response
    # json.dumps escapes every non-ASCII and control character: the text holds no NUL, which
    # a Postgres TEXT column refuses.
    answer = (None,) * 4 if r is None else (r.status, json.dumps(r.body), json.dumps(r.headers), r.subject)
    return (entry.body_hash, entry.claimed_at, entry.expires_at, *answer)


class SqlIdempotencyStore:
    """`IdempotencyStore` over a `Database`; its calls run on a worker thread of its own, and a
    database error is `IdempotencyUnavailable` (the pipeline answers 503 before a claim, and
    retries storing an answer after one).

    Its own thread, not the event loop's default workers: a store stuck behind another
    session's lock then holds up keyed requests only (each until its deadline), not the audit
    records every request builds on those workers (stop 49). One is enough: the database runs
    one transaction at a time on its one connection anyway."""

    def __init__(
        self,
        db: Database,
        ttl_s: float = ANSWER_TTL_S,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
        clock: Callable[[], float] | None = None,
        sweep_every_s: float = 60.0,
    ) -> None:
        """`clock`: None (the database's clock) except in tests, which move time by hand."""
        self.db = db
        self.ttl_s = ttl_s
        self.claim_timeout_s = claim_timeout_s  # a crashed owner's claim lapses after this
        self.sweep_every_s = sweep_every_s
        self._clock = clock
        self._errors = database_errors()
        self._next_sweep_at = -math.inf
        prepare(db, SCHEMA)
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="idempotency-store")

    @classmethod
    def in_state_dir(
        cls, state: Path, ttl_s: float = ANSWER_TTL_S, claim_timeout_s: float = CLAIM_TIMEOUT_S
    ) -> SqlIdempotencyStore:
        """`<state>/idempotency.db`, or the shared database of `$SWITCHYARD_DATABASE_URL`."""
        check_claim_bound(claim_timeout_s, MAX_DEADLINE_MS / 1000)  # every set the loader takes
        db = open_store(state, Store.IDEMPOTENCY)
        try:
            return cls(db, ttl_s, claim_timeout_s)
        except BaseException:
            db.close()
            raise

    def close(self) -> None:
        self._worker.shutdown(wait=False)  # a call stuck on the database must not hold a shutdown
        self.db.close()

    # ------------------------------------------------------------ the protocol

    async def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        """A caller that leaves (hangs up, or its deadline passes) withdraws its claim if the
        worker has not started it: a store that comes back after being stuck then works through
        what is still wanted, not a backlog of claims, and their frees, for requests already
        answered 503. A claim under way is made all the same, and freed."""
        job = self._worker.submit(self._claim, scope, key, body_hash)
        try:
            return await self._result(job)
        except asyncio.CancelledError:
            if not job.cancel():  # under way, or made: free it once made, if it was won
                job.add_done_callback(self._free_if_won(scope, key))
            raise

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        await self._run(self._complete, scope, key, response)

    async def abandon(self, scope: str, key: str) -> None:
        await self._run(self._abandon, scope, key)

    async def purge_subject(self, scope: str, subject: str) -> int:
        return await self._run(self._purge_subject, scope, subject)

    async def _run(self, operation: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        # The store's worker, so the event loop never waits on the database. A caller cancelled
        # meanwhile does not stop a transaction under way (one not started yet is not run).
        return await self._result(self._worker.submit(functools.partial(operation, *args, **kwargs)))

    async def _result(self, job: Future[T]) -> T:
        try:
            return await asyncio.wrap_future(job)
        except self._errors as exc:
            raise IdempotencyUnavailable(
                f"the idempotency store at {redacted(self.db.url)} failed: {type(exc).__name__}: {exc}"
            ) from exc

    def _free_if_won(self, scope: str, key: str) -> Callable[[Future[Claim]], None]:
        def free(job: Future[Claim]) -> None:  # on the worker, or here if the job is done
            if job.cancelled() or job.exception() is not None or job.result().outcome != "owner":
                return
            try:
                self._worker.submit(self._abandon_left, scope, key)
            except RuntimeError:  # the store is closed: the claim lapses after the claim timeout
                log.warning("idempotency claim of %s left by its caller will lapse: the store is closed", scope)

        return free

    def _abandon_left(self, scope: str, key: str) -> None:
        try:
            self._abandon(scope, key)
        except self._errors as exc:
            log.warning(
                "could not release the idempotency claim of %s left by its caller; it will lapse: %s", scope, exc
            )

    # ------------------------------------------------------------ one transaction each

    def _claim(self, scope: str, key: str, body_hash: str) -> Claim:
        with self.db.transaction() as tx:
            now = self._now(tx)
            self._sweep_if_due(tx, now)
            for _ in range(_CLAIM_ROUNDS):
                entry = self._locked(tx, scope, key)
                claim, kept = decide_claim(entry, body_hash, now, self.ttl_s, self.claim_timeout_s)
                if self._keep(tx, scope, key, entry, kept):
                    return claim
        raise IdempotencyUnavailable(f"idempotency key {key!r} of {scope}: too contended to claim; retry")

    def _complete(self, scope: str, key: str, response: StoredResponse) -> None:
        with self.db.transaction() as tx:
            now = self._now(tx)
            if response.subject is not None:
                # Before the row (the lock order): a purge of this subject runs wholly before
                # this, and its marker is seen, or wholly after, and it deletes this answer.
                tx.lock(_subject_lock(scope, response.subject))
            entry = self._locked(tx, scope, key)
            until = 0.0
            if entry is not None and response.subject is not None:
                marker = tx.execute(
                    "SELECT until FROM idempotency_erasures WHERE scope = ? AND subject = ?",
                    (scope, response.subject),
                ).one()
                until = 0.0 if marker is None else float(marker[0])
            self._keep(tx, scope, key, entry, after_complete(entry, response, now, self.ttl_s, until))

    def _abandon(self, scope: str, key: str) -> None:
        with self.db.transaction() as tx:
            entry = self._locked(tx, scope, key)
            self._keep(tx, scope, key, entry, after_abandon(entry))

    def _purge_subject(self, scope: str, subject: str) -> int:
        with self.db.transaction() as tx:
            now = self._now(tx)
            tx.lock(_subject_lock(scope, subject))
            tx.lock(_BULK_LOCK)
            tx.execute(
                "INSERT INTO idempotency_erasures (scope, subject, until) VALUES (?, ?, ?)"
                " ON CONFLICT (scope, subject) DO UPDATE SET until = excluded.until",
                (scope, subject, erasure_until(now, self.ttl_s)),
            )
            rows = tx.execute(
                f"SELECT key, {_COLUMNS} FROM idempotency_entries WHERE scope = ? AND subject = ?"
                f" ORDER BY key{self.db.lock_rows}",
                (scope, subject),
            ).rows
            doomed = [str(row[0]) for row in rows if erased_by(_entry(row[1:]), subject)]
            for key in doomed:
                tx.execute("DELETE FROM idempotency_entries WHERE scope = ? AND key = ?", (scope, key))
            return len(doomed)

    # ------------------------------------------------------------ rows

    def _now(self, tx: Transaction) -> float:
        return self._clock() if self._clock is not None else database_time(self.db, tx)

    def _locked(self, tx: Transaction, scope: str, key: str) -> IdempotencyEntry | None:
        row = tx.execute(
            f"SELECT {_COLUMNS} FROM idempotency_entries WHERE scope = ? AND key = ?{self.db.lock_rows}",
            (scope, key),
        ).one()
        return None if row is None else _entry(row)

    def _keep(
        self, tx: Transaction, scope: str, key: str, before: IdempotencyEntry | None, after: IdempotencyEntry | None
    ) -> bool:
        """Store the decision's entry; False if another claimant inserted the row first."""
        if after is before:
            return True
        if after is None:
            tx.execute("DELETE FROM idempotency_entries WHERE scope = ? AND key = ?", (scope, key))
            return True
        if before is None:
            inserted = tx.execute(
                f"INSERT INTO idempotency_entries (scope, key, {_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)"
                " ON CONFLICT (scope, key) DO NOTHING",
                (scope, key, *_values(after)),
            )
            return inserted.rowcount == 1
        tx.execute(
            "UPDATE idempotency_entries SET body_hash = ?, claimed_at = ?, expires_at = ?, status = ?,"
            " body = ?, headers = ?, subject = ? WHERE scope = ? AND key = ?",
            (*_values(after), scope, key),
        )
        return True

    def _sweep_if_due(self, tx: Transaction, now: float) -> None:
        # Two threads of one store may both sweep at once; that costs a second, empty sweep.
        if now < self._next_sweep_at:
            return
        self._next_sweep_at = now + self.sweep_every_s
        tx.lock(_BULK_LOCK)
        tx.execute("DELETE FROM idempotency_entries WHERE expires_at <= ?", (now,))
        tx.execute("DELETE FROM idempotency_erasures WHERE until <= ?", (now,))
