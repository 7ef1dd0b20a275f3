"""Web console sessions: a key signs in once, the browser then holds a session cookie.

The cookie carries a random 256-bit token; only its SHA-256 is stored (`console_sessions` in
the keys database), so a copy of the database signs no one in. A session names the key it was
opened with, and every page view resolves the key again: a revoked or expired key ends all of
its sessions at once, as the gateway refuses the key itself. Each session has its own CSRF
token, which every state-changing form (sign-out) must echo.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from switchyard.db.engine import Transaction, database_time
from switchyard.policy.keys import KeyStore, Principal

DEFAULT_TTL_S = 8 * 3600.0  # a working day; a longer-lived view is a Grafana dashboard, not a session


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Session:
    principal: Principal
    csrf: str
    expires_at: float

    def csrf_matches(self, sent: str | None) -> bool:
        return sent is not None and hmac.compare_digest(self.csrf, sent)


class SessionStore:
    """Opens, resolves and ends sessions in the key store's database (SQLite or Postgres)."""

    def __init__(self, keys: KeyStore, ttl_s: float = DEFAULT_TTL_S, clock: Callable[[], float] | None = None) -> None:
        """`clock`: tests inject one. Without one, sessions open, expire and end by the
        database's clock, as keys expire (`KeyStore`): every console replica agrees on it."""
        self.keys = keys
        self.ttl_s = ttl_s
        self.clock = clock

    def _now(self, tx: Transaction) -> float:
        return self.clock() if self.clock is not None else database_time(self.keys.db, tx)

    def open(self, key: str) -> tuple[str, Session] | None:
        """Sign in with an API key: a new session token and its session, or None when the key
        is unknown, revoked or expired."""
        principal = self.keys.verify(key)
        if principal is None:
            return None
        token, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        with self.keys.db.transaction() as tx:
            now = self._now(tx)
            tx.execute(
                "INSERT INTO console_sessions (token_hash, key_id, csrf, created_at, expires_at)"
                " VALUES (?, ?, ?, ?, ?)",
                (_digest(token), principal.key_id, csrf, now, now + self.ttl_s),
            )
        return token, Session(principal, csrf, now + self.ttl_s)

    def resolve(self, token: str | None) -> Session | None:
        """The live session a cookie names, or None (no such session, ended, expired, or its
        key no longer valid)."""
        if not token:
            return None
        with self.keys.db.read() as tx:
            row = tx.execute(
                "SELECT key_id, csrf, expires_at, ended_at FROM console_sessions WHERE token_hash = ?",
                (_digest(token),),
            ).one()
            now = self._now(tx)
        if row is None or row[3] is not None or row[2] <= now:
            return None
        record = self.keys.get(row[0])
        if record is None or not record.active or record.expired(now):
            return None
        return Session(Principal(record.key_id, record.team, record.role), row[1], row[2])

    def end(self, token: str) -> None:
        with self.keys.db.transaction() as tx:
            tx.execute(
                "UPDATE console_sessions SET ended_at = ? WHERE token_hash = ? AND ended_at IS NULL",
                (self._now(tx), _digest(token)),
            )

    def prune(self, older_than_s: float = 7 * 86_400.0) -> int:
        """Delete sessions that expired or ended more than `older_than_s` ago; how many."""
        with self.keys.db.transaction() as tx:
            cutoff = self._now(tx) - older_than_s
            return tx.execute(
                "DELETE FROM console_sessions WHERE expires_at < ? OR (ended_at IS NOT NULL AND ended_at < ?)",
                (cutoff, cutoff),
            ).rowcount
