"""Per-subject body keys, kept apart from the records so erasure is deleting one row.

A subject is an end user of a team (`<team>/<user>`) or the team itself (`<team>/`).
Bodies are sealed with AES-256-GCM under the subject's key; deleting the key makes every
body of that subject unreadable ("crypto-shredding") without touching the chained records.
The key database uses `secure_delete` and a rollback journal (not WAL) so a deleted key's
bytes are overwritten in the file rather than left in a free page or a WAL frame.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import sqlite3
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

_SCHEMA = """
CREATE TABLE IF NOT EXISTS subject_keys (
    key_id     TEXT PRIMARY KEY,
    subject    TEXT NOT NULL UNIQUE,
    key        BLOB NOT NULL,
    created_at REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS erasures (
    subject   TEXT NOT NULL,
    erased_at REAL NOT NULL,
    erased_by TEXT NOT NULL
);
"""


class KeyErased(Exception):
    """The key that sealed a body was deleted: the body can no longer be read."""


def subject_of(team: str, user: str | None) -> str:
    return f"{team}/{user or ''}"


class SubjectKeyring:
    """`<state>/audit/keys.db`: one random 256-bit key per subject, created on first use."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("PRAGMA journal_mode=DELETE")
            db.executescript(_SCHEMA)
        path.chmod(0o600)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite3.connect(self.path, timeout=30)) as db, db:
            db.execute("PRAGMA secure_delete=ON")
            yield db

    def key_for(self, subject: str) -> tuple[str, bytes]:
        """The subject's current (key id, key), created on first use, and again after an
        erasure: bodies sealed before it stay unreadable, later ones use the new key."""
        with self._db() as db:
            row = db.execute("SELECT key_id, key FROM subject_keys WHERE subject = ?", (subject,)).fetchone()
            if row is None:
                db.execute(
                    "INSERT OR IGNORE INTO subject_keys VALUES (?, ?, ?, ?)",
                    (
                        secrets.token_hex(8),
                        subject,
                        AESGCM.generate_key(bit_length=256),
                        time.time(),
                    ),
                )
                row = db.execute("SELECT key_id, key FROM subject_keys WHERE subject = ?", (subject,)).fetchone()
        return str(row[0]), bytes(row[1])

    def key_by_id(self, key_id: str) -> bytes:
        with self._db() as db:
            row = db.execute("SELECT key FROM subject_keys WHERE key_id = ?", (key_id,)).fetchone()
        if row is None:
            raise KeyErased(f"key {key_id} was erased")
        return bytes(row[0])

    def erase(self, subject: str, erased_by: str) -> bool:
        """Delete the subject's key for good. Returns False if it had none."""
        with self._db() as db:
            cur = db.execute("DELETE FROM subject_keys WHERE subject = ?", (subject,))
            db.execute("INSERT INTO erasures VALUES (?, ?, ?)", (subject, time.time(), erased_by))
        with closing(sqlite3.connect(self.path)) as db:
            db.execute("VACUUM")  # rewrite the file so no page keeps the old key
        return cur.rowcount > 0

    def erasures(self, subject: str) -> list[tuple[float, str]]:
        with self._db() as db:
            rows = db.execute("SELECT erased_at, erased_by FROM erasures WHERE subject = ?", (subject,))
            return [(float(r[0]), str(r[1])) for r in rows.fetchall()]


def seal(key: bytes, plaintext: str, associated: str) -> bytes:
    """AES-256-GCM; `associated` (request id and part) binds a body to its record."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext.encode(), associated.encode())


def unseal(key: bytes, sealed: bytes, associated: str) -> str:
    return AESGCM(key).decrypt(sealed[:12], sealed[12:], associated.encode()).decode()


def keyed_digest(key: bytes, text: str) -> str:
    """Hash-only storage: an HMAC, so a guessable value cannot be confirmed by hashing guesses,
    and erasing the key unlinks the digest from the subject too."""
    return "hmac-sha256:" + hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def plain_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def unb64(text: str) -> bytes:
    return base64.b64decode(text)
