"""The ledger's durable store: SQLite (WAL) by default, Postgres by a URL. One SQL text serves both.

Statements are written with `?` placeholders (SQLite's style) and translated for psycopg.
Both dialects get a serialised read-modify-write per transaction: SQLite by `BEGIN IMMEDIATE`
(one writer at a time), Postgres by row locks (`FOR UPDATE`, and the row lock an `INSERT ... ON
CONFLICT DO UPDATE` takes), always taken in key order so two transactions cannot deadlock.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from switchyard import sqlite_db

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")


@dataclass(frozen=True)
class Result:
    rows: list[tuple[Any, ...]]
    rowcount: int


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result: ...


class Database(Protocol):
    url: str
    lock_rows: str  # " FOR UPDATE" where the dialect has row locks, else ""

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def close(self) -> None: ...


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        cur = self._conn.execute(sql, tuple(params))
        return Result(cur.fetchall(), cur.rowcount)


class SqliteDatabase:
    """One connection, serialised by a lock; WAL so readers (the CLI) never block the ledger."""

    lock_rows = ""

    def __init__(self, path: Path) -> None:
        self.url = SQLITE_PREFIX + str(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are explicit `BEGIN IMMEDIATE` below.
        # WAL, synchronous=FULL (a settled charge survives a power cut): switchyard.sqlite_db.
        self._conn = sqlite_db.connect(path, autocommit=True)
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[_SqliteTx]:
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()


class _PostgresTx:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        cur = self._conn.execute(sql.replace("?", "%s"), tuple(params))
        rows = cur.fetchall() if cur.description is not None else []
        return Result(rows, cur.rowcount)


class PostgresDatabase:
    lock_rows = " FOR UPDATE"

    def __init__(self, url: str) -> None:
        import psycopg  # imported here: SQLite deployments never load it

        self.url = url
        self._conn = psycopg.connect(url, autocommit=True)
        self._lock = threading.Lock()

    @contextmanager
    def transaction(self) -> Iterator[_PostgresTx]:
        with self._lock, self._conn.transaction():
            yield _PostgresTx(self._conn)

    def close(self) -> None:
        self._conn.close()


def open_database(url: str) -> SqliteDatabase | PostgresDatabase:
    """`sqlite:////abs/path/ledger.db` or `postgresql://user@host:port/db`."""
    if url.startswith(SQLITE_PREFIX):
        return SqliteDatabase(Path(url[len(SQLITE_PREFIX) :]))
    if url.startswith(POSTGRES_PREFIXES):
        return PostgresDatabase(url)
    raise ValueError(f"ledger URL {url!r}: expected {SQLITE_PREFIX}<path> or postgresql://user@host:port/db")


LEDGER_URL_ENV = "SWITCHYARD_LEDGER_URL"


def ledger_url(state: Path, explicit: str | None = None) -> str:
    """`explicit`, else `$SWITCHYARD_LEDGER_URL`, else `ledger.db` (SQLite) in the state directory."""
    return explicit or os.environ.get(LEDGER_URL_ENV) or SQLITE_PREFIX + str(state / "ledger.db")
