"""Per-subject keys, kept apart from the records so erasure is deleting one row.

A subject is an end user of a team (`<team>/<user>`) or the team itself (`<team>/`, the
requests that named no user). The subject's key does two things:
- it seals every stored body of the subject (AES-256-GCM), whatever the data class;
- it names the subject everywhere else: records, S3 copies, the budget ledger and stored
  idempotent answers carry `pseudonym(key, subject)`, never the id the team sent.
Deleting the key ("crypto-shredding") makes the bodies unreadable and the pseudonym
unlinkable to anyone, without touching the chained records.

The keys are `Store.SUBJECT_KEYS`'s database (`switchyard.db.location`), shared by every
writer: a key is created with `INSERT ... ON CONFLICT (subject) DO NOTHING` and read back,
so two replicas (or hosts) meeting a new subject at once agree on one key. What a deleted
key leaves behind, by backend:
- **SQLite** (`<state>/audit/keys.db`): `secure_delete` and a rollback journal (not WAL),
  then `VACUUM`, so its bytes are overwritten in the file rather than left in a free page or
  a WAL frame.
- **Postgres**: the row is deleted and `VACUUM FULL subject_keys` rewrites the table into a
  new file without it (a plain VACUUM was measured to leave the bytes in the page). The table
  is one small row per subject, so the rewrite's exclusive lock holds `key_for` for
  milliseconds, once per erasure. The bound is weaker than SQLite's and the operator's to set:
  the key's bytes can remain in WAL segments (and their archive), in base backups until those
  age out under their retention, and in the filesystem blocks of the old file until reused.
  VACUUM FULL waits for open transactions, and needs the role erasing to own the table (the
  platform's own role does).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import secrets
import time
from pathlib import Path

from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from switchyard.db.engine import Database, Transaction
from switchyard.db.location import Store, open_store
from switchyard.db.migrations import Migration, Schema, prepare


def _forget_named_erasures(tx: Transaction, db: Database) -> None:
    # Erasures recorded before pseudonyms named the subject in clear ("<team>/<user>"; a
    # pseudonym has no "/"): forget the name, keep the fact. The pattern is a parameter:
    # psycopg would read a literal `%` in the statement as a placeholder.
    tx.execute("UPDATE erasures SET subject = '' WHERE subject LIKE ?", ("%/%",))


_V1 = (
    """CREATE TABLE IF NOT EXISTS subject_keys (
        key_id     TEXT PRIMARY KEY,
        subject    TEXT NOT NULL UNIQUE,
        key        {blob} NOT NULL,
        created_at DOUBLE PRECISION NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS erasures (
        subject   TEXT NOT NULL,
        erased_at DOUBLE PRECISION NOT NULL,
        erased_by TEXT NOT NULL
    )""",
    _forget_named_erasures,
)
SCHEMA = Schema("subject_keys", (Migration(1, _V1),))
# `erasures.subject` holds the erased pseudonym ("" when the subject had no key), never the
# subject's id: the row outlives the key it records the deletion of.

_PSEUDONYM_LABEL = b"switchyard pseudonym v1\0"  # keeps the HMAC apart from any other use of the key
_VACUUM = {"sqlite": "VACUUM", "postgres": "VACUUM FULL subject_keys"}  # SQLite vacuums the whole file


class KeyErased(Exception):
    """The key that sealed a body was deleted: the body can no longer be read."""


def subject_of(team: str, user: str | None) -> str:
    return f"{team}/{user or ''}"


class SubjectKeyring:
    """One random 256-bit key per subject, created on first use, in `db` (the keyring owns it)."""

    def __init__(self, db: Database) -> None:
        self.db = db
        prepare(db, SCHEMA)

    @classmethod
    def in_state_dir(cls, state: Path) -> SubjectKeyring:
        return cls(open_store(Path(state), Store.SUBJECT_KEYS))

    def close(self) -> None:
        self.db.close()

    def _current(self, subject: str) -> tuple[str, bytes] | None:
        with self.db.read() as tx:
            row = tx.execute("SELECT key_id, key FROM subject_keys WHERE subject = ?", (subject,)).one()
        return None if row is None else (str(row[0]), bytes(row[1]))

    def key_for(self, subject: str) -> tuple[str, bytes]:
        """The subject's current (key id, key), created on first use, and again after an
        erasure: bodies sealed before it stay unreadable, later ones use the new key."""
        found = self._current(subject)  # a read first: every request asks, few create
        if found is not None:
            return found
        with self.db.transaction() as tx:
            # Another writer may create the subject's key first: then this insert does nothing
            # (on Postgres it waits for that writer's commit) and both read back its key.
            tx.execute(
                "INSERT INTO subject_keys (key_id, subject, key, created_at) VALUES (?, ?, ?, ?)"
                " ON CONFLICT (subject) DO NOTHING",
                (secrets.token_hex(8), subject, AESGCM.generate_key(bit_length=256), time.time()),
            )
            row = tx.execute("SELECT key_id, key FROM subject_keys WHERE subject = ?", (subject,)).one()
        assert row is not None  # inserted, or kept by the insert that won
        return str(row[0]), bytes(row[1])

    def pseudonym_for(self, team: str, user: str | None) -> str:
        """What records, exports, the ledger and the idempotency store call this subject
        (creates its key on first use, like `key_for`)."""
        subject = subject_of(team, user)
        return pseudonym(self.key_for(subject)[1], subject)

    def existing_pseudonym(self, subject: str) -> str | None:
        """The subject's current pseudonym, or None if it has no key (creates none)."""
        found = self._current(subject)
        return None if found is None else pseudonym(found[1], subject)

    def key_by_id(self, key_id: str) -> bytes:
        with self.db.read() as tx:
            row = tx.execute("SELECT key FROM subject_keys WHERE key_id = ?", (key_id,)).one()
        if row is None:
            raise KeyErased(f"key {key_id} was erased")
        return bytes(row[0])

    def erase(self, subject: str, erased_by: str) -> str | None:
        """Delete the subject's key for good. Returns the pseudonym the key gave the subject,
        or None if it had no key."""
        with self.db.transaction() as tx:
            row = tx.execute("SELECT key FROM subject_keys WHERE subject = ?" + self.db.lock_rows, (subject,)).one()
            alias = None if row is None else pseudonym(bytes(row[0]), subject)
            tx.execute("DELETE FROM subject_keys WHERE subject = ?", (subject,))
            tx.execute(
                "INSERT INTO erasures (subject, erased_at, erased_by) VALUES (?, ?, ?)",
                (alias or "", time.time(), erased_by),
            )
        self.db.outside_transaction(_VACUUM[self.db.dialect])  # the bound per backend: the module docstring
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
