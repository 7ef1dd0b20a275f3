"""The live scheduler's event log: what happened to each workload, for operators and reports.

Submitted, admitted (with the wait), preemption notice, requeued, released, ... one row each;
queue-time reports and `switchyard train events` read it. It is not the scheduler's durable
state: that is the write-ahead log and its snapshots (`scheduler_wal`). Rows that follow from a
logged driver event carry that record's `wal_seq`, so a restart that replays the log writes only
the rows it had not written yet (`last_wal_seq`). Hence `synchronous=NORMAL` on this one
connection: a commit survives the process being killed (WAL mode), and what a power cut could
take from this table the replay writes again.

The database also holds the snapshot row of journals from before the write-ahead log (a
pickle), read once by `legacy_state` to migrate. Its notices were the api's `Notice` models, a
class since replaced by `PreemptionNotice`: `legacy_state` reads them as that.
"""

from __future__ import annotations

import io
import json
import pickle
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from switchyard import sqlite_db
from switchyard.scheduler.preemption_channel import PreemptionNotice

_SCHEMA = """
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


class _PickledNotice:
    """A `switchyard.scheduler.api.Notice` (a pydantic model: workload_id, lease_id, reason,
    stop_deadline) as an old pickle holds it: its fields, until `_load_legacy` converts it."""

    fields: dict[str, Any]

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.fields = dict(state["__dict__"])  # a pydantic model pickles its fields under "__dict__"

    def notice(self, sent_at: float) -> PreemptionNotice:
        f = self.fields
        return PreemptionNotice(
            f["workload_id"], f["reason"], f["stop_deadline"], sent_at=sent_at, lease_id=f["lease_id"]
        )


class _LegacyUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) == ("switchyard.scheduler.api", "Notice"):
            return _PickledNotice
        return super().find_class(module, name)


def _load_legacy(blob: bytes) -> Any:
    """The pickled state (our own file, written by an older version), its notices converted: each
    sent when the core put its lease under notice (the lease's `notice_at`, set in the same call),
    or, without that lease, now (it was sent by then)."""
    state = _LegacyUnpickler(io.BytesIO(blob)).load()
    notices = getattr(state, "notices", {})
    leases = state.core.leases() if notices else {}
    for workload_id, old in notices.items():
        if isinstance(old, _PickledNotice):
            lease = leases.get(old.fields["lease_id"])
            sent_at = lease.notice_at if lease is not None else None
            notices[workload_id] = old.notice(time.time() if sent_at is None else sent_at)
    return state


class SchedulerJournal:
    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # one connection, shared by the actor's threads
        self._db: sqlite3.Connection = sqlite_db.connect(path, autocommit=True)
        self._db.execute("PRAGMA synchronous=NORMAL")  # why: see the module docstring
        self._db.executescript(_SCHEMA)
        columns = {row[1] for row in self._db.execute("PRAGMA table_info(events)")}
        if "wal_seq" not in columns:  # journals from before the write-ahead log
            self._db.execute("ALTER TABLE events ADD COLUMN wal_seq INTEGER")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def legacy_state(self) -> Any | None:
        """The pickled state of a journal from before the write-ahead log, if it has one."""
        with self._lock:
            table = self._db.execute("SELECT name FROM sqlite_master WHERE name = 'snapshot'").fetchone()
            row = None if table is None else self._db.execute("SELECT state FROM snapshot WHERE id = 1").fetchone()
        return None if row is None else _load_legacy(row[0])

    def last_wal_seq(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT MAX(wal_seq) FROM events").fetchone()
        return int(row[0]) if row[0] is not None else 0

    def event(
        self, kind: str, workload_id: str, team: str, at: float, wal_seq: int | None = None, **details: Any
    ) -> None:
        with self._lock:
            self._db.execute(
                "INSERT INTO events (at, kind, workload_id, team, details, wal_seq) VALUES (?, ?, ?, ?, ?, ?)",
                (at, kind, workload_id, team, json.dumps(details, sort_keys=True, default=str), wal_seq),
            )

    def events(self, workload_id: str | None = None, limit: int = 1000) -> list[dict[str, Any]]:
        sql = "SELECT seq, at, kind, workload_id, team, details FROM events"
        args: tuple[Any, ...] = ()
        if workload_id is not None:
            sql += " WHERE workload_id = ?"
            args = (workload_id,)
        with self._lock:
            rows = self._db.execute(sql + " ORDER BY seq DESC LIMIT ?", (*args, limit)).fetchall()
        return [
            {"seq": r[0], "at": r[1], "kind": r[2], "workload_id": r[3], "team": r[4], **json.loads(r[5])}
            for r in reversed(rows)
        ]
