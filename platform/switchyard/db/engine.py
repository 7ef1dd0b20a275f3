"""SQLite (WAL) on one host, Postgres for a cluster: one SQL text serves both.

Statements are written with `?` placeholders (SQLite's style) and translated for psycopg; DDL
names a byte column `{blob}` (BLOB / BYTEA). What the stores rely on, in both dialects:

- **Serialised read-modify-write.** SQLite: `BEGIN IMMEDIATE` (one writer at a time).
  Postgres: row locks (`FOR UPDATE`, the lock an `INSERT ... ON CONFLICT` takes), always in key
  order so two transactions cannot deadlock, or `tx.lock(name)` (a transaction-scoped advisory
  lock) where a whole sequence must be serialised, such as appending to a hash chain.
- **Reads that never block a writer**: `read()` (SQLite: a deferred transaction on WAL;
  Postgres: a snapshot).
- **A lock wait is bounded**, by SQLite's busy timeout and by Postgres's `lock_timeout`, both
  `sqlite_db.BUSY_TIMEOUT_S`: a transaction behind a lock that is not let go (a stuck session,
  a migration) fails with the database's error instead of waiting for as long as it is held.
- **A lost connection is not a lost store.** A Postgres connection that broke (the server
  restarted, a network blip) is replaced on the next transaction; a transaction that cannot
  even begin is retried once on a fresh connection, since nothing of it ran.
"""

from __future__ import annotations

import sqlite3
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

from switchyard import sqlite_db

SQLITE_PREFIX = "sqlite:///"
POSTGRES_PREFIXES = ("postgresql://", "postgres://")

Dialect = Literal["sqlite", "postgres"]
_BLOB = {"sqlite": "BLOB", "postgres": "BYTEA"}


@dataclass(frozen=True)
class Result:
    rows: list[tuple[Any, ...]]
    rowcount: int

    def one(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None


class Transaction(Protocol):
    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result: ...

    def lock(self, name: str) -> None:
        """Hold `name` until the transaction ends: two transactions that lock the same name
        run one after the other (SQLite's write transactions already do)."""
        ...


class Database(Protocol):
    url: str
    dialect: Dialect
    lock_rows: str  # " FOR UPDATE" where the dialect has row locks, else ""
    # A query of the database's own clock, in seconds since the epoch: the one clock every
    # process sharing the store agrees on, whatever the clocks of their hosts say.
    clock_sql: str

    def transaction(self) -> AbstractContextManager[Transaction]: ...

    def read(self) -> AbstractContextManager[Transaction]: ...

    def outside_transaction(self, sql: str) -> None:
        """A statement that must not run in a transaction (VACUUM)."""
        ...

    def close(self) -> None: ...


def database_time(db: Database, tx: Transaction) -> float:
    """The database's clock (`Database.clock_sql`) in seconds since the epoch, read in `tx`."""
    row = tx.execute(db.clock_sql).one()
    assert row is not None  # a SELECT of one value
    return float(row[0])


class DatabaseUnavailable(RuntimeError):
    """A store's database could not be opened (unreachable, refused, not a database, no such
    directory); the message names it, without its password."""


def database_errors(*also: type[Exception]) -> tuple[type[Exception], ...]:
    """What a store's database raises when it cannot answer (locked, unreachable, refused):
    sqlite3's and psycopg's base errors (psycopg imported only when asked), `open_database`'s
    `DatabaseUnavailable`, plus `also`, for an `except` that catches them together."""
    import psycopg

    return (sqlite3.Error, psycopg.Error, DatabaseUnavailable, *also)


def ddl(db: Database, text: str) -> str:
    """A schema statement for `db`'s dialect (`{blob}` is the byte-string column type)."""
    return text.replace("{blob}", _BLOB[db.dialect])


def postgres_lock_key(name: str) -> int:
    """A stable 32-bit advisory-lock key for `name` (hash() varies between processes)."""
    return zlib.crc32(name.encode())


class _SqliteTx:
    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        cur = self._conn.execute(sql, tuple(params))
        return Result(cur.fetchall(), cur.rowcount)

    def lock(self, name: str) -> None:
        """A write transaction holds SQLite's one write lock already."""


class SqliteDatabase:
    """One connection, serialised by a lock; WAL so readers (the CLI) never block a writer.

    `secure_delete`: a rollback journal and overwritten free pages instead (the subject key
    store, where erasing is deleting a row: `switchyard.sqlite_db`)."""

    dialect: Dialect = "sqlite"
    lock_rows = ""
    clock_sql = "SELECT (julianday('now') - 2440587.5) * 86400.0"  # unixepoch('subsec') needs 3.42

    def __init__(self, path: Path, *, secure_delete: bool = False) -> None:
        self.url = SQLITE_PREFIX + str(path)
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Autocommit mode: transactions are explicit `BEGIN` below.
        # synchronous=FULL (a committed write survives a power cut): switchyard.sqlite_db.
        self._conn = sqlite_db.connect(path, autocommit=True, secure_delete=secure_delete)
        path.chmod(0o600)  # every store here holds key hashes, money or audit records
        self._lock = threading.Lock()

    @contextmanager
    def _begin(self, statement: str) -> Iterator[_SqliteTx]:
        with self._lock:
            self._conn.execute(statement)  # outside the try: nothing to roll back if it fails
            try:
                yield _SqliteTx(self._conn)
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def transaction(self) -> AbstractContextManager[_SqliteTx]:
        return self._begin("BEGIN IMMEDIATE")

    def read(self) -> AbstractContextManager[_SqliteTx]:
        return self._begin("BEGIN")

    def outside_transaction(self, sql: str) -> None:
        with self._lock:
            self._conn.execute(sql)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


class _PostgresTx:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    def execute(self, sql: str, params: Sequence[Any] = ()) -> Result:
        # No parameters: none are bound, so a literal `%` (LIKE '%x') is not read as a placeholder.
        cur = self._conn.execute(sql.replace("?", "%s"), tuple(params) or None)
        rows = cur.fetchall() if cur.description is not None else []
        return Result(rows, cur.rowcount)

    def lock(self, name: str) -> None:
        self._conn.execute("SELECT pg_advisory_xact_lock(%s)", (postgres_lock_key(name),))


class PostgresDatabase:
    dialect: Dialect = "postgres"
    lock_rows = " FOR UPDATE"
    clock_sql = "SELECT extract(epoch FROM clock_timestamp())::double precision"

    def __init__(
        self, url: str, connect_timeout_s: float = 10.0, lock_timeout_s: float = sqlite_db.BUSY_TIMEOUT_S
    ) -> None:
        import psycopg  # imported here: SQLite deployments never load it

        self._psycopg = psycopg
        self.url = url
        self._connect_timeout_s = connect_timeout_s
        self._lock_timeout_s = lock_timeout_s
        self._lock = threading.Lock()
        self._conn = self._connect()

    def _connect(self) -> Any:
        conn = self._psycopg.connect(self.url, autocommit=True, connect_timeout=int(self._connect_timeout_s))
        # Postgres waits for a lock without end by default; bound it as SQLite's busy timeout
        # does, so a session that holds a lock and does not go on fails this one's statement
        # (LockNotAvailable) rather than holding the store's one connection as long as it likes.
        conn.execute("SELECT set_config('lock_timeout', %s, false)", (f"{round(self._lock_timeout_s * 1000)}ms",))
        return conn

    def _live(self) -> Any:
        if self._conn.closed or self._conn.broken:
            self._conn = self._connect()
        return self._conn

    @contextmanager
    def transaction(self) -> Iterator[_PostgresTx]:
        with self._lock:
            conn = self._live()
            try:
                scope = conn.transaction()
                scope.__enter__()
            except self._psycopg.OperationalError:
                # BEGIN failed: nothing ran. The server may have restarted since the last use.
                conn = self._conn = self._connect()
                scope = conn.transaction()
                scope.__enter__()
            try:
                yield _PostgresTx(conn)
            except BaseException as exc:
                scope.__exit__(type(exc), exc, exc.__traceback__)
                raise
            scope.__exit__(None, None, None)

    def read(self) -> AbstractContextManager[_PostgresTx]:
        return self.transaction()  # a snapshot; Postgres readers never block writers

    def outside_transaction(self, sql: str) -> None:
        with self._lock:
            self._live().execute(sql)

    def close(self) -> None:
        with self._lock:
            self._conn.close()


def open_database(url: str, *, secure_delete: bool = False) -> SqliteDatabase | PostgresDatabase:
    """`sqlite:////abs/path/ledger.db` or `postgresql://user@host:port/db`. Raises
    `DatabaseUnavailable` when it cannot be opened: the CLI prints that, not the driver's
    traceback (a Postgres that refused, a file that is not SQLite: stop 44)."""
    if not url.startswith((SQLITE_PREFIX, *POSTGRES_PREFIXES)):
        raise ValueError(f"database URL {url!r}: expected {SQLITE_PREFIX}<path> or postgresql://user@host:port/db")
    try:
        if url.startswith(SQLITE_PREFIX):
            return SqliteDatabase(Path(url[len(SQLITE_PREFIX) :]), secure_delete=secure_delete)
        return PostgresDatabase(url)
    except database_errors(OSError) as exc:
        reason = " ".join(str(exc).split()) or type(exc).__name__  # psycopg's message spans lines
        raise DatabaseUnavailable(f"cannot open the database {redacted(url)}: {reason}") from exc


def redacted(url: str) -> str:
    """A database URL without its password, for messages and logs."""
    scheme, sep, rest = url.partition("://")
    if not sep or "@" not in rest:
        return url
    credentials, _, host = rest.rpartition("@")
    user = credentials.split(":", 1)[0]
    return f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"
