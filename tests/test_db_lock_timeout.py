"""A transaction behind a lock that another session holds and does not let go (a stuck
session, a migration waiting on one) fails with the database's error within the lock timeout,
on Postgres as on SQLite, instead of waiting for as long as the lock is held and keeping its
store's one connection the while. The connection serves the next transaction."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
import pytest

from switchyard.db.engine import PostgresDatabase, postgres_lock_key
from switchyard.sqlite_db import BUSY_TIMEOUT_S
from tests.shared_db import fresh_postgres, postgres_url


@contextmanager
def held(*statements: str) -> Iterator[None]:
    """Another session that takes a lock and does not go on until the block ends."""
    holder = psycopg.connect(postgres_url(), autocommit=True)
    holder.execute("BEGIN")
    for sql in statements:
        holder.execute(sql)
    try:
        yield
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_postgres_lock_wait_is_bounded_by_the_busy_timeout_by_default() -> None:
    db = fresh_postgres()
    try:
        with db.read() as tx:
            shown = tx.execute("SHOW lock_timeout").one()
        assert shown == (f"{BUSY_TIMEOUT_S:g}s",)  # Postgres's own default is 0: wait for ever
    finally:
        db.close()


@pytest.mark.parametrize("lock", ["advisory", "table"])
def test_a_transaction_behind_a_lock_not_let_go_fails_in_time_and_the_connection_goes_on(lock: str) -> None:
    fresh_postgres().close()
    db = PostgresDatabase(postgres_url(), lock_timeout_s=0.5)
    try:
        db.outside_transaction("CREATE TABLE entries (k INTEGER PRIMARY KEY)")
        hold = (
            f"SELECT pg_advisory_xact_lock({postgres_lock_key('chain')})"
            if lock == "advisory"
            else "LOCK TABLE entries IN ACCESS EXCLUSIVE MODE"  # what a migration takes
        )
        with held(hold):
            started = time.monotonic()
            with pytest.raises(psycopg.errors.LockNotAvailable), db.transaction() as tx:
                tx.lock("chain")
                tx.execute("INSERT INTO entries VALUES (1)")
            assert time.monotonic() - started < 3
        with db.transaction() as tx:  # let go: the same store goes on, on its connection
            tx.lock("chain")
            tx.execute("INSERT INTO entries VALUES (1)")
        with db.read() as tx:
            assert tx.execute("SELECT k FROM entries").rows == [(1,)]
    finally:
        db.close()
