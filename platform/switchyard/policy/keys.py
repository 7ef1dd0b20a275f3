"""API keys: shown once, stored only as hashes, in the keys database (never in git).

A key looks like `sy_<key id>_<secret>`. The key id finds the row in O(1); the secret is
checked against its SHA-256 with a constant-time compare. A plain hash (not a slow KDF) is
enough because the secret is 256 random bits, not a password a person chose, and the
gateway verifies a key on every request.

A key may expire (`expires_at`); an expired key is refused like a revoked one, checked at the
time of each verification. Every create, rotate and revoke is written, in the same
transaction as the change itself, to `key_events`: an append-only hash chain (the audit
log's, `switchyard.audit.chain`) of who did what to which key, never a secret.

The database is `<state>/keys.db` (SQLite) or the cluster's shared Postgres
(`switchyard.db.location`). Key changes are serialised across processes on both backends, so
the chain never forks, and its head's seq is the store's `version()`: what the gateway polls
to know its in-memory snapshot is stale.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, NamedTuple

from switchyard.audit.chain import GENESIS, ChainRow, Finding, link_hash, verify_rows
from switchyard.db.engine import Database, Transaction, database_time
from switchyard.db.location import Store, open_store
from switchyard.db.migrations import Migration, Schema, prepare
from switchyard.policy.models import Role
from switchyard.steady_clock import SteadyClock

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


LATEST_EXPIRY = 253_402_300_799.0
"""9999-12-31 23:59:59 UTC, the last instant a date can show: a key created to expire later
(`--expires 999999999999d`) was stored, then every listing of the keys failed to print it."""


def _storable_expiry(expires_at: float | None) -> float | None:
    if expires_at is not None and not (math.isfinite(expires_at) and expires_at <= LATEST_EXPIRY):
        raise ValueError(f"a key's expiry must be a time up to 9999-12-31 23:59:59 UTC, got {expires_at!r}")
    return expires_at


def _expired(expires_at: float | None, now: float) -> bool:
    return expires_at is not None and now >= expires_at


def parse_key(key: str) -> tuple[str, str] | None:
    parts = key.split("_", 2)
    if len(parts) != 3 or parts[0] != KEY_PREFIX or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


# Timestamps are DOUBLE PRECISION: Postgres REAL is float4, which rounds a time of today to 128 s.
_API_KEYS = """CREATE TABLE IF NOT EXISTS api_keys (
    key_id      TEXT PRIMARY KEY,
    team        TEXT NOT NULL,
    role        TEXT NOT NULL,
    secret_hash TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    revoked_at  DOUBLE PRECISION,
    note        TEXT NOT NULL DEFAULT '',
    expires_at  DOUBLE PRECISION
)"""
_KEY_EVENTS = """CREATE TABLE IF NOT EXISTS key_events (
    seq       {seq},
    team      TEXT NOT NULL,
    time      DOUBLE PRECISION NOT NULL,
    payload   TEXT NOT NULL,
    prev_hash TEXT NOT NULL,
    hash      TEXT NOT NULL
)"""
# Every event's seq is written explicitly (the head's + 1): a Postgres identity would leave a
# gap at each rolled-back append, which the chain check reads as a deleted event. SQLite keeps
# the AUTOINCREMENT its existing files were made with; an explicit seq satisfies it.
_SEQ_COLUMN = {"sqlite": "INTEGER PRIMARY KEY AUTOINCREMENT", "postgres": "BIGINT PRIMARY KEY"}
_CHANGES_LOCK = "key_events"  # held by every key change: the check, the change and its event are one step


def _create_key_events(tx: Transaction, db: Database) -> None:
    tx.execute(_KEY_EVENTS.replace("{seq}", _SEQ_COLUMN[db.dialect]))


def _add_expires_at(tx: Transaction, db: Database) -> None:
    """SQLite files made before keys could expire lack `expires_at` (no Postgres ever did)."""
    if db.dialect != "sqlite":
        return
    if "expires_at" not in {row[1] for row in tx.execute("PRAGMA table_info(api_keys)").rows}:
        tx.execute("ALTER TABLE api_keys ADD COLUMN expires_at REAL")


_PLATFORM_SECRETS = """CREATE TABLE IF NOT EXISTS platform_secrets (
    name       TEXT PRIMARY KEY,
    secret     TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
)"""
# A signed-in key's web console session (`switchyard.console.sessions`): only the token's hash
# is stored; a session lives until it expires or is ended, and never outlives its key.
_CONSOLE_SESSIONS = """CREATE TABLE IF NOT EXISTS console_sessions (
    token_hash TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    csrf       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION NOT NULL,
    ended_at   DOUBLE PRECISION
)"""
# 2: the platform's own secrets (the eval signing key), where every node reads them.
# 3: the web console's sessions.
SCHEMA = Schema(
    "keys",
    (
        Migration(1, (_API_KEYS, _create_key_events, _add_expires_at)),
        Migration(2, (_PLATFORM_SECRETS,)),
        Migration(3, (_CONSOLE_SESSIONS,)),
    ),
)
_COLUMNS = "key_id, team, role, created_at, revoked_at, note, expires_at"


def _record(row: tuple[Any, ...]) -> KeyRecord:
    key_id, team, role, created, revoked, note, expires = row
    return KeyRecord(key_id, team, Role(role), created, revoked, note, expires)


class KeyStore:
    """The key table and its event chain in one `Database`, which the store owns (`close()`).

    Safe to use from several processes on either backend: every change is one transaction that
    first takes the changes' lock (SQLite's write transaction already is one), so two admins
    rotating the same key cannot both succeed.

    `clock`: tests inject one, for stamps and expiry alike. Without one, changes are stamped
    by this host's clock, and expiry is decided by the database's: the one clock every gateway
    replica and CLI agrees on. (By each host's own, a replica 10 minutes behind accepted a key
    for 10 minutes after it expired: stop 48.)"""

    def __init__(self, db: Database, clock: Clock | None = None) -> None:
        self.db = db
        self.clock = clock or time.time
        self._expiry_by_database = clock is None
        prepare(db, SCHEMA)

    @classmethod
    def in_state_dir(cls, state: Path, clock: Clock | None = None) -> KeyStore:
        """`<state>/keys.db`, or the shared database where `$SWITCHYARD_DATABASE_URL` names one."""
        db = open_store(state, Store.KEYS)
        try:
            return cls(db, clock)
        except BaseException:
            db.close()  # a schema refused at open must not leak the connection
            raise

    def close(self) -> None:
        self.db.close()

    def __enter__(self) -> KeyStore:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()

    @contextmanager
    def _change(self) -> Iterator[Transaction]:
        """One key change, serialised with every other: reading the key, changing it and
        appending to the chain's head must not interleave with another process doing the same."""
        with self.db.transaction() as tx:
            tx.lock(_CHANGES_LOCK)
            yield tx

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
        with self._change() as tx:
            key, record = self._insert(tx, team, role, note, expires_at)
            self._event(tx, "create", record, by, expires_at=expires_at)
        return key, record

    def rotate(
        self, key_id: str, *, expires_at: float | None = None, by: Principal | None = None
    ) -> tuple[str, KeyRecord]:
        """Issue a new key with the same team and role and revoke the old one, in one transaction.

        The old key's expiry is not carried over: the new key expires at `expires_at` (None: never)."""
        with self._change() as tx:
            old = self._active(tx, key_id)
            key, record = self._insert(tx, old.team, old.role, f"rotated from {key_id}", expires_at)
            tx.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (record.created_at, key_id))
            self._event(tx, "rotate", old, by, new_key_id=record.key_id, expires_at=expires_at)
        return key, record

    def revoke(self, key_id: str, *, by: Principal | None = None) -> KeyRecord:
        with self._change() as tx:
            old = self._active(tx, key_id)
            revoked_at = self.clock()
            tx.execute("UPDATE api_keys SET revoked_at = ? WHERE key_id = ?", (revoked_at, key_id))
            self._event(tx, "revoke", old, by)
        return KeyRecord(old.key_id, old.team, old.role, old.created_at, revoked_at, old.note, old.expires_at)

    def _active(self, tx: Transaction, key_id: str) -> KeyRecord:
        row = tx.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ? AND revoked_at IS NULL", (key_id,)).one()
        if row is None:
            raise UnknownKeyError(f"no active key with id {key_id!r}")
        return _record(row)

    def _insert(
        self, tx: Transaction, team: str, role: Role, note: str, expires_at: float | None
    ) -> tuple[str, KeyRecord]:
        _storable_expiry(expires_at)  # before anything is written
        key_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        now = self.clock()
        tx.execute(
            f"INSERT INTO api_keys ({_COLUMNS}, secret_hash) VALUES (?, ?, ?, ?, NULL, ?, ?, ?)",
            (key_id, team, role.value, now, note, expires_at, _hash(secret)),
        )
        return f"{KEY_PREFIX}_{key_id}_{secret}", KeyRecord(key_id, team, role, now, None, note, expires_at)

    def _event(
        self,
        tx: Transaction,
        action: KeyAction,
        target: KeyRecord,
        by: Principal | None,
        *,
        new_key_id: str | None = None,
        expires_at: float | None = None,
    ) -> None:
        head = tx.execute("SELECT seq, hash FROM key_events ORDER BY seq DESC LIMIT 1").one()
        seq, prev = (1, GENESIS) if head is None else (int(head[0]) + 1, str(head[1]))
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
        tx.execute(
            "INSERT INTO key_events (seq, team, time, payload, prev_hash, hash) VALUES (?, ?, ?, ?, ?, ?)",
            (seq, target.team, now, payload, prev, link_hash(prev, payload)),
        )

    # ------------------------------------------------------------ reading

    def events(self, team: str | None = None) -> list[KeyEvent]:
        sql = "SELECT seq, payload, hash FROM key_events"
        args: tuple[str, ...] = ()
        if team is not None:
            sql, args = sql + " WHERE team = ?", (team,)
        with self.db.read() as tx:
            rows = tx.execute(sql + " ORDER BY seq", args).rows
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
        with self.db.read() as tx:
            rows = tx.execute("SELECT seq, payload, prev_hash, hash FROM key_events ORDER BY seq").rows
        return verify_rows(ChainRow(*r) for r in rows)

    def list(self, team: str | None = None, include_revoked: bool = False) -> list[KeyRecord]:
        sql = f"SELECT {_COLUMNS} FROM api_keys"
        where: list[str] = []
        args: list[str] = []
        if team is not None:
            where.append("team = ?")
            args.append(team)
        if not include_revoked:
            where.append("revoked_at IS NULL")
        if where:
            sql += " WHERE " + " AND ".join(where)
        with self.db.read() as tx:
            rows = tx.execute(sql + " ORDER BY created_at", args).rows
        return [_record(r) for r in rows]

    def get(self, key_id: str) -> KeyRecord | None:
        with self.db.read() as tx:
            r = tx.execute(f"SELECT {_COLUMNS} FROM api_keys WHERE key_id = ?", (key_id,)).one()
        return None if r is None else _record(r)

    def verify(self, key: str) -> Principal | None:
        """The principal a presented key speaks for, or None if it is unknown, revoked or expired."""
        parsed = parse_key(key)
        if parsed is None:
            return None
        key_id, secret = parsed
        with self.db.read() as tx:
            row = tx.execute(
                "SELECT team, role, secret_hash, expires_at FROM api_keys WHERE key_id = ? AND revoked_at IS NULL",
                (key_id,),
            ).one()
            now = database_time(self.db, tx) if self._expiry_by_database else self.clock()
        if row is None or not hmac.compare_digest(row[2], _hash(secret)) or _expired(row[3], now):
            return None
        return Principal(key_id, row[0], Role(row[1]))

    def verifier(self) -> KeyVerifier:
        """An in-memory snapshot for the request hot path (no database read per request)."""
        with self.db.read() as tx:
            rows = tx.execute(
                "SELECT key_id, team, role, secret_hash, expires_at FROM api_keys WHERE revoked_at IS NULL"
            ).rows
            # The snapshot may live for days: the database's time now, counted on monotonically.
            clock = SteadyClock(database_time(self.db, tx)) if self._expiry_by_database else self.clock
        return KeyVerifier({r[0]: KeyEntry(r[1], Role(r[2]), r[3], r[4]) for r in rows}, clock)

    # ------------------------------------------------------------ the platform's own secrets

    def secret(self, name: str) -> str | None:
        with self.db.read() as tx:
            row = tx.execute("SELECT secret FROM platform_secrets WHERE name = ?", (name,)).one()
        return None if row is None else str(row[0])

    def ensure_secret(self, name: str, candidate: str) -> str:
        """The secret `name`, stored as `candidate` if there was none; of two racing callers
        both get the first one stored."""
        with self.db.transaction() as tx:
            tx.execute(
                "INSERT INTO platform_secrets (name, secret, created_at) VALUES (?, ?, ?)"
                " ON CONFLICT (name) DO NOTHING",
                (name, candidate, self.clock()),
            )
            row = tx.execute("SELECT secret FROM platform_secrets WHERE name = ?", (name,)).one()
        assert row is not None  # inserted above, or already there
        return str(row[0])

    def version(self) -> int:
        """Changes with every create, rotate and revoke, from any process: the event chain's
        head seq (each change appends its event in the same transaction). 0: no change yet.

        One indexed read, cheap enough to poll; unlike a file's mtime it means the same on
        Postgres and cannot miss two writes inside the filesystem's timestamp granularity."""
        with self.db.read() as tx:
            row = tx.execute("SELECT MAX(seq) FROM key_events").one()
        return 0 if row is None or row[0] is None else int(row[0])


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
