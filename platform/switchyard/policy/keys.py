"""API keys: shown once, stored only as hashes, in the state directory (never in git).

A key looks like `sy_<key id>_<secret>`. The key id finds the row in O(1); the secret is
checked against its SHA-256 with a constant-time compare. A plain hash (not a slow KDF) is
enough because the secret is 256 random bits, not a password a person chose, and the
gateway verifies a key on every request.

A key may expire (`expires_at`); an expired key is refused like a revoked one, checked at the
time of each verification. Every create, rotate and revoke is written, in the same SQLite
transaction as the change itself, to `key_events`: an append-only hash chain (the audit
log's, `switchyard.audit.chain`) of who did what to which key, never a secret.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, NamedTuple

from switchyard import sqlite_db
from switchyard.audit.chain import GENESIS, ChainRow, Finding, link_hash, verify_rows
from switchyard.policy.models import Role

KEY_PREFIX = "sy"
PLATFORM_TEAM = "platform"  # the team that auditor and platform-admin keys belong to; no policy team may use it

Clock = Callable[[], float]
KeyAction = Literal["create", "rotate", "revoke"]


class UnknownKeyError(Exception):
    """A key id that does not name an active key."""


@dataclass(frozen=True)
class KeyRecord:
    key_id: str
    team: str
    role: Role
    created_at: float
    revoked_at: float | None
    note: str
    expires_at: float | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None

    def expired(self, now: float) -> bool:
        return self.expires_at is not None and now >= self.expires_at


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from a valid, unrevoked, unexpired key."""

    key_id: str
    team: str
    role: Role


@dataclass(frozen=True)
class KeyEvent:
    """One entry of the key-event chain. `by_key_id` is None for keys `switchyard up` made
    itself (the operator's first admin key, the demo key): no key existed to act with."""

    seq: int
    time: float
    action: KeyAction
    key_id: str  # the key acted on (rotate: the key replaced)
    team: str
    role: Role
    new_key_id: str | None  # rotate: the key that replaced it
    expires_at: float | None  # create and rotate: the new key's expiry
    by_key_id: str | None
    by_role: Role | None
    hash: str


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def _expired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and now >= expires_at


def parse_key(key: str) -> tuple[str, str] | None:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS api_keys (
    key_id      TEXT PRIMARY KEY,
    team        TEXT NOT NULL,
    role        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  REAL NOT NULL,
    revoked_at  REAL,
    note        TEXT NOT NULL DEFAULT '',
    expires_at  REAL
);
CREATE TABLE IF NOT EXISTS key_events (
    seq       INTEGER PRIMARY KEY AUTOINCREMENT,
    team      TEXT NOT NULL,
    time      REAL NOT NULL,
    payload   TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
);
"""
_COLUMNS = "key_id, team, role, created_at, revoked_at, note, expires_at"


def _record(row: tuple[Any, ...]) -> KeyRecord:
    key_id, team, role, created, revoked, note, expires = row
    return KeyRecord(key_id, team, Role(role), created, revoked, note, expires)


class KeyStore:
    """The key table in `<state>/keys.db`. Safe to open from several processes (SQLite WAL).

    `clock` stamps creation, revocation and events and decides expiry; tests inject one."""

    def __init__(self, path: Path, clock: Clock = time.time) -> None:
        self.path = path
        self.clock = clock
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.executescript(_SCHEMA)
        self._migrate()
        path.chmod(0o600)

    @classmethod
    def in_state_dir(cls, state: Path, clock: Clock = time.time) -> KeyStore:
        return cls(state / "keys.db", clock)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite_db.connect(self.path)) as db, db:
            yield db

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken up front: reading the chain head and appending to it
        must not interleave with another process doing the same."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            yield db

    def _migrate(self) -> None:
        """Databases made before keys could expire lack `expires_at`; add it (once, under the lock)."""

        def missing(db: sqlite3.Connection) -> bool:
            return "expires_at" not in {r[1] for r in db.execute("PRAGMA table_info(api_keys)")}

        with self._db() as db:
            if not missing(db):
                return
        with self._write() as db:
            if missing(db):
                db.execute("ALTER TABLE api_keys ADD COLUMN expires_at REAL")

    # ------------------------------------------------------------ changes (each one an event)

    def create(
        self,
        team: str,
        role: Role,
        note: str = "",
        *,
        expires_at: float | None = None,
        by: Principal | None = None,
    ) -> tuple[str, KeyRecord]:
        """Create a key. The returned secret is never stored and cannot be shown again."""
        with self._write() as db:
            key, record = self._insert(db, team, role, note, expires_at)
            self._event(db, "create", record, by, expires_at=expires_at)
        return key, record

    def rotate(
        self, key_id: str, *, expires_at: float | None = None, by: Principal | None = None
    ) -> tuple[str, KeyRecord]:
        """Issue a new key with the same team and role and revoke the old one, in one transaction.

        The old key's expiry is not carried over: the new key expires at `expires_at` (None: never)."""
        with self._write() as db:
            old = self._active(db, key_id)
            key, record = self._insert(db, old.team, old.role, f"rotated from {key_id}", expires_at)
            db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (record.created_at, key_id))
            self._event(db, "rotate", old, by, new_key_id=record.key_id, expires_at=expires_at)
        return key, record

    def revoke(self, key_id: str, *, by: Principal | None = None) -> KeyRecord:
        with self._write() as db:
            old = self._active(db, key_id)
            db.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (self.clock(), key_id))
            self._event(db, "revoke", old, by)
        record = self.get(key_id)
        assert record is not None
        return record

    def _active(self, db: sqlite3.Connection, key_id: str) -> KeyRecord:
        row = db.execute(
            f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ? AND revoked_at IS NULL", (key_id,)
        ).fetchone()
        if row is None:
            raise UnknownKeyError(f"no active key with id {key_id!r}")
        return _record(row)

    def _insert(
        self, db: sqlite3.Connection, team: str, role: Role, note: str, expires_at: float | None
    ) -> tuple[str, KeyRecord]:
        key_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        now = self.clock()
        db.execute(
            f"INSERT INTO api_keys ({_COLUMNS}, secret_hash) VALUES (?, ?, ?, ?, NULL, ?, ?, ?)",
            (key_id, team, role.value, now, note, expires_at, _hash(secret)),
        )
        return f"{KEY_PREFIX}_{key_id}_{secret}", KeyRecord(key_id, team, role, now, None, note, expires_at)

    def _event(
        self,
        db: sqlite3.Connection,
        action: KeyAction,
        target: KeyRecord,
        by: Principal | None,
        *,
        new_key_id: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        row = db.execute("SELECT hash FROM key_events ORDER BY seq DESC LIMIT 1").fetchone()
        prev = row[0] if row else GENESIS
        now = self.clock()
        payload = json.dumps(
            {
                "time": now,
                "action": action,
                "key_id": target.key_id,
                "team": target.team,
                "role": target.role.value,
                "new_key_id": new_key_id,
                "expires_at": expires_at,
                "by_key_id": None if by is None else by.key_id,
                "by_role": None if by is None else by.role.value,
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        db.execute(
            "INSERT INTO key_events (team, time, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?)",
            (target.team, now, payload, prev, link_hash(prev, payload)),
        )

    # ------------------------------------------------------------ reading

    def events(self, team: str | None = None) -> list[KeyEvent]:
        sql = "SELECT seq, payload, hash FROM key_events"
        args: tuple[str, ...] = ()
        if team is not None:
            sql, args = sql + " WHERE team = ?", (team,)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY seq", args).fetchall()
        out = []
        for seq, payload, digest in rows:
            p = json.loads(payload)
            out.append(
                KeyEvent(
                    seq,
                    p["time"],
                    p["action"],
                    p["key_id"],
                    p["team"],
                    Role(p["role"]),
                    p["new_key_id"],
                    p["expires_at"],
                    p["by_key_id"],
                    None if p["by_role"] is None else Role(p["by_role"]),
                    digest,
                )
            )
        return out

    def verify_events(self) -> list[Finding]:
        """Check the key-event chain; an empty list means no event was edited, removed or moved."""
        with self._db() as db:
            rows = db.execute("SELECT seq, payload, prev_hash, hash FROM key_events ORDER BY seq").fetchall()
        return verify_rows(ChainRow(*r) for r in rows)

    def list(self, team: str | None = None, include_revoked: bool = False) -> list[KeyRecord]:
        sql = f"SELECT {_COLUMNS} FROM api_keys"
        where, args = [], []
        if team is not None:
            where.append("team = ?")
            args.append(team)
        if not include_revoked:
            where.append("revoked_at IS NULL")
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self._db() as db:
            rows = db.execute(sql + " ORDER BY created_at", args).fetchall()
        return [_record(r) for r in rows]

    def get(self, key_id: str) -> KeyRecord | None:
        with self._db() as db:
            r = db.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)).fetchone()
        return None if r is None else _record(r)

    def verify(self, key: str) -> Principal | None:
        """The principal a presented key speaks for, or None if it is unknown, revoked or expired."""
        parsed = parse_key(key)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self._db() as db:
            row = db.execute(
                "SELECT team, role, secret_hash, expires_at FROM api_keys WHERE key_id = ? AND revoked_at IS NULL",
                (key_id,),
            ).fetchone()
        if row is None or not hmac.compare_digest(row[2], _hash(secret)) or _expired(row[3], self.clock()):
            return None
        return Principal(key_id, row[0], Role(row[1]))

    def verifier(self) -> KeyVerifier:
        """An in-memory snapshot for the request hot path (no SQLite read per request)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT key_id, team, role, secret_hash, expires_at FROM api_keys WHERE revoked_at IS NULL"
            ).fetchall()
        return KeyVerifier({r[0]: KeyEntry(r[1], Role(r[2]), r[3], r[4]) for r in rows}, self.clock)

    def mtime(self) -> float:
        """Changes whenever a key is created or revoked (WAL file included)."""
        wal = self.path.with_name(self.path.name + "-wal")
        return max(p.stat().st_mtime for p in (self.path, wal) if p.exists())


class KeyEntry(NamedTuple):
    team: str
    role: Role
    secret_hash: str
    expires_at: float | None


@dataclass(frozen=True)
class KeyVerifier:
    entries: dict[str, KeyEntry]
    # Read at every verification: the snapshot lives until the key database changes, and a key
    # expiring changes nothing in the database.
    clock: Clock = field(default=time.time)

    def verify(self, key: str) -> Principal | None:
        parsed = parse_key(key)
        if parsed is None:
            return None
        entry = self.entries.get(parsed[0])
        if (
            entry is None
            or not hmac.compare_digest(entry.secret_hash, _hash(parsed[1]))
            or _expired(entry.expires_at, self.clock())
        ):
            return None
        return Principal(parsed[0], entry.team, entry.role)
