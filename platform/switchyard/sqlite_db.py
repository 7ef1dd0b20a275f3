"""The one way switchyard opens a SQLite database: every store (keys, audit, subject keys,
ledger, scheduler journal) gets the same busy timeout and the same journal settings.

- `journal_mode=WAL`: readers (the CLI, reports, `audit verify`) never block the writer, and
  several processes (gateway replicas, the CLI) share one file.
- `synchronous=FULL`: a committed transaction survives a power cut, not only a process crash.
  Every store here holds something that must not roll back: money (ledger), audit records, API
  keys and their revocations, erasures, the scheduler's acknowledged changes. FULL was already
  SQLite's default for the stores that did not set it, so no store got slower.
- `foreign_keys=ON`: SQLite leaves it off by default; a schema that declares a reference means it.
- `busy_timeout` of `BUSY_TIMEOUT_S`: a writer waits that long for another process's write lock,
  then fails with `sqlite3.OperationalError` ("database is locked"). Every transaction here is
  milliseconds long; 10 s rides out a slow disk, and fails well inside a flow's deadline (30 s
  by default) rather than holding a request until it expires.

One exception, by argument: `secure_delete=True` (the subject key database) uses a rollback
journal instead of WAL and `secure_delete=ON`, so a deleted key's bytes are overwritten in the
file instead of lingering in a WAL frame or a free page: erasure there is deleting a row.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

BUSY_TIMEOUT_S = 10.0


def _set_journal_mode(db: sqlite3.Connection, mode: str) -> None:
    """`PRAGMA journal_mode`, waiting out another process setting it: on a file several
    processes open at once (two `switchyard up`s on a fresh state dir), the change needs a lock
    SQLite does not wait for under `busy_timeout`, and 8 of 60 such races failed at once with
    "database is locked" (four openers of one new file)."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            db.execute(f"PRAGMA journal_mode={mode}")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def connect(
    path: Path | str,
    *,
    readonly: bool = False,
    autocommit: bool = False,
    secure_delete: bool = False,
) -> sqlite3.Connection:
    """Open `path` with the settings above.

    `readonly`: a connection that cannot write (`mode=ro`); it leaves the journal mode as the
    writers set it. `autocommit`: no implicit transactions (`isolation_level=None`), for stores
    that issue their own `BEGIN IMMEDIATE`. The connection may be used from any thread
    (`check_same_thread=False`): a store that shares one connection serialises it with its own
    lock, the others open one per operation.
    """
    target = f"{Path(path).resolve().as_uri()}?mode=ro" if readonly else str(path)
    db = sqlite3.connect(
        target,
        timeout=BUSY_TIMEOUT_S,
        isolation_level=None if autocommit else "DEFERRED",
        check_same_thread=False,
        uri=readonly,
    )
    try:
        if not readonly:
            _set_journal_mode(db, "DELETE" if secure_delete else "WAL")
        db.execute("PRAGMA synchronous=FULL")
        db.execute("PRAGMA foreign_keys=ON")
        if secure_delete:
            db.execute("PRAGMA secure_delete=ON")
    except BaseException:
        db.close()
        raise
    return db
