"""API keys: shown once, stored only as hashes, in the state directory (never in git).

A key looks like `sy_<key id>_<secret>`. The key id finds the row in O(1); the secret is
checked against its SHA-256 with a constant-time compare. A plain hash (not a slow KDF) is
enough because the secret is 256 random bits, not a password a person chose, and the
gateway verifies a key on every request.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path

from switchyard.policy.models import Role

KEY_PREFIX = "sy"
PLATFORM_TEAM = "platform"  # the team that auditor and platform-admin keys belong to


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

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class Principal:
    """Who is calling: resolved from a valid, unrevoked key."""

    key_id: str
    team: str
    role: Role


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


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
    note        TEXT NOT NULL DEFAULT ''
);
"""


class KeyStore:
    """The key table in `<state>/keys.db`. Safe to open from several processes (SQLite WAL)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=WAL")
            db.executescript(_SCHEMA)
        path.chmod(0o600)

    @classmethod
    def in_state_dir(cls, state: Path) -> KeyStore:
        return cls(state / "keys.db")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=10)) as db, db:
            yield db

    def create(self, team: str, role: Role, note: str = "") -> tuple[str, KeyRecord]:
        """Create a key. The returned secret is never stored and cannot be shown again."""
        key_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        now = time.time()
        with self._db() as db:
            db.execute(
                "INSERT INTO api_keys VALUES (?, ?, ?, ?, ?, NULL, ?)",
                (key_id, team, role.value, _hash(secret), now, note),
            )
        return f"{KEY_PREFIX}_{key_id}_{secret}", KeyRecord(key_id, team, role, now, None, note)

    def list(self, team: str | None = None, include_revoked: bool = False) -> list[KeyRecord]:
        sql = "SELECT key_id, team, role, created_at, revoked_at, note FROM api_keys"
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
        return [KeyRecord(r[0], r[1], Role(r[2]), r[3], r[4], r[5]) for r in rows]

    def get(self, key_id: str) -> KeyRecord | None:
        with self._db() as db:
            r = db.execute(
                "SELECT key_id, team, role, created_at, revoked_at, note FROM api_keys WHERE key_id = ?",
                (key_id,),
            ).fetchone()
        return None if r is None else KeyRecord(r[0], r[1], Role(r[2]), r[3], r[4], r[5])

    def revoke(self, key_id: str) -> KeyRecord:
        with self._db() as db:
            cur = db.execute(
                "UPDATE api_keys SET revoked_at = ? WHERE key_id = ? AND revoked_at IS NULL",
                (time.time(), key_id),
            )
        if cur.rowcount == 0:
            raise UnknownKeyError(f"no active key with id {key_id!r}")
        record = self.get(key_id)
        assert record is not None
        return record

    def rotate(self, key_id: str) -> tuple[str, KeyRecord]:
        """Issue a new key with the same team and role, then revoke the old one."""
        old = self.get(key_id)
        if old is None or not old.active:
            raise UnknownKeyError(f"no active key with id {key_id!r}")
        key, record = self.create(old.team, old.role, note=f"rotated from {key_id}")
        self.revoke(key_id)
        return key, record

    def verify(self, key: str) -> Principal | None:
        """The principal a presented key speaks for, or None if it is unknown or revoked."""
        parsed = parse_key(key)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self._db() as db:
            row = db.execute(
                "SELECT team, role, secret_hash FROM api_keys WHERE key_id = ? AND revoked_at IS NULL",
                (key_id,),
            ).fetchone()
        if row is None or not hmac.compare_digest(row[2], _hash(secret)):
            return None
        return Principal(key_id, row[0], Role(row[1]))

    def verifier(self) -> KeyVerifier:
        """An in-memory snapshot for the request hot path (no SQLite read per request)."""
        with self._db() as db:
            rows = db.execute(
                "SELECT key_id, team, role, secret_hash FROM api_keys WHERE revoked_at IS NULL"
            ).fetchall()
        return KeyVerifier({r[0]: (r[1], Role(r[2]), r[3]) for r in rows})

    def mtime(self) -> float:
        """Changes whenever a key is created or revoked (WAL file included)."""
        wal = self.path.with_name(self.path.name + "-wal")
        return max(p.stat().st_mtime for p in (self.path, wal) if p.exists())


@dataclass(frozen=True)
class KeyVerifier:
    entries: dict[str, tuple[str, Role, str]]

    def verify(self, key: str) -> Principal | None:
        parsed = parse_key(key)
        if parsed is None:
            return None
        entry = self.entries.get(parsed[0])
        if entry is None or not hmac.compare_digest(entry[2], _hash(parsed[1])):
            return None
        return Principal(parsed[0], entry[0], entry[1])
