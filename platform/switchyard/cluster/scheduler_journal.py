"""The live scheduler's durable state: a snapshot of its queues and leases, and an event log.

The snapshot is written inside the same lock as every change, before the caller (or a
waiting job) can observe the change, so a restarted actor resumes exactly where the last
acknowledged change left it. The event log (submitted, admitted, preempted, released, ...)
is append-only and is what queue-time reports are computed from.
"""

from __future__ import annotations

import json
import pickle
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

from switchyard import sqlite_db

_SCHEMA = """
CREATE TABLE IF NOT EXISTS snapshot (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    saved_at REAL NOT NULL,
    state BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    at REAL NOT NULL,
    kind TEXT NOT NULL,
    workload_id TEXT NOT NULL,
    team TEXT NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS events_by_workload ON events (workload_id, seq);
"""


class SchedulerJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(_SCHEMA)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite_db.connect(self.path)) as db, db:
            yield db

    def save(self, state: Any) -> None:
        # pickle: the state is the core's own plain dataclasses, written and read by the same
        # code version (an actor restart), never exchanged with anything else.
        blob = pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)
        with self._db() as db:
            db.execute("INSERT OR REPLACE INTO snapshot VALUES (1, ?, ?)", (time.time(), blob))

    def load(self) -> Any | None:
        with self._db() as db:
            row = db.execute("SELECT state FROM snapshot WHERE id = 1").fetchone()
        return None if row is None else pickle.loads(row[0])  # our own file, see save()

    def event(self, kind: str, workload_id: str, team: str, at: float, **details: Any) -> None:
        with self._db() as db:
            db.execute(
                "INSERT INTO events (at, kind, workload_id, team, details) VALUES (?, ?, ?, ?, ?)",
                (at, kind, workload_id, team, json.dumps(details, sort_keys=True, default=str)),
            )

    def events(self, workload_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        sql = "SELECT seq, at, kind, workload_id, team, details FROM events"
        args: tuple[Any, ...] = ()
        if workload_id is not None:
            sql += " WHERE workload_id = ?"
            args = (workload_id,)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [
            {"seq": r[0], "at": r[1], "kind": r[2], "workload_id": r[3], "team": r[4], **json.loads(r[5])}
            for r in reversed(rows)
        ]
