"""Per-subject keys, kept apart from the records so erasure is deleting one row.

A subject is an end user of a team (`<team>/<user>`) or the team itself (`<team>/`, the
requests that named no user). The subject's key does two things:
- it seals every stored body of the subject (AES-256-GCM), whatever the data class;
- it names the subject everywhere else: records, S3 copies, the budget ledger and stored
  idempotent answers carry `pseudonym(key, subject)`, never the id the team sent.
Deleting the key ("crypto-shredding") makes the bodies unreadable and the pseudonym
unlinkable to anyone, without touching the chained records. The key database uses
`secure_delete` and a rollback journal (not WAL) so a deleted key's bytes are overwritten
in the file rather than left in a free page or a WAL frame.
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

from switchyard import sqlite_db

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
# `erasures.subject` holds the erased pseudonym ("" when the subject had no key), never the
# subject's id: the row outlives the key it records the deletion of.

_PSEUDONYM_LABEL = b"switchyard pseudonym v1\0"  # keeps the HMAC apart from any other use of the key


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
            db.executescript(_SCHEMA)
            # Erasures recorded before pseudonyms named the subject in clear ("<team>/<user>";
            # a pseudonym has no "/"): forget the name, keep the fact.
            db.execute("UPDATE erasures SET subject = '' WHERE subject LIKE '%/%'")
        path.chmod(0o600)

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        with closing(sqlite_db.connect(self.path, secure_delete=True)) as db, db:
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

    def pseudonym_for(self, team: str, user: str | None) -> str:
        """What records, exports, the ledger and the idempotency store call this subject
        (creates its key on first use, like `key_for`)."""
        subject = subject_of(team, user)
        return pseudonym(self.key_for(subject)[1], subject)

    def existing_pseudonym(self, subject: str) -> str | None:
        """The subject's current pseudonym, or None if it has no key (creates none)."""
        with self._db() as db:
            row = db.execute("SELECT key FROM subject_keys WHERE subject = ?", (subject,)).fetchone()
        return None if row is None else pseudonym(bytes(row[0]), subject)

    def key_by_id(self, key_id: str) -> bytes:
        with self._db() as db:
            row = db.execute("SELECT key FROM subject_keys WHERE key_id = ?", (key_id,)).fetchone()
        if row is None:
            raise KeyErased(f"key {key_id} was erased")
        return bytes(row[0])

    def erase(self, subject: str, erased_by: str) -> str | None:
        """Delete the subject's key for good. Returns the pseudonym the key gave the subject,
        or None if it had no key."""
        with self._db() as db:
            row = db.execute("SELECT key FROM subject_keys WHERE subject = ?", (subject,)).fetchone()
            alias = None if row is None else pseudonym(bytes(row[0]), subject)
            db.execute("DELETE FROM subject_keys WHERE subject = ?", (subject,))
            db.execute("INSERT INTO erasures VALUES (?, ?, ?)", (alias or "", time.time(), erased_by))
        with closing(sqlite_db.connect(self.path, secure_delete=True)) as db:
            db.execute("VACUUM")  # rewrite the file so no page keeps the old key
        return alias


def pseudonym(subject_key: bytes, subject: str) -> str:
    """The subject's name outside keys.db: an HMAC-SHA256 of the subject under its own key.

    Stable while the key lives, so a user's records and budget line link up; once erasure
    deletes the key nobody can tell whose it was, not even by trying candidate ids. A new key
    after an erasure gives a new, unrelated pseudonym."""
    return "p-" + hmac.new(subject_key, _PSEUDONYM_LABEL + subject.encode(), hashlib.sha256).hexdigest()[:32]


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
