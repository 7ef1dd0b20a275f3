"""Eval records signed by the operator who ran them: HMAC-SHA256 with the deployment's key
(`<state>/eval_signing.key` on one host; in the shared database on a cluster).

A record under `policies/evals/records/` is YAML that anyone with write access to the policy
repository could type. The signature proves that `switchyard eval run` wrote it where the
state directory's key is (created 0600 on first signing), and `signed_by` names the key id of
the principal that ran it. The gateway checks records with the same key, so a record written
by hand, edited after the run (a score raised, a hash swapped), or signed for another
deployment counts for nothing: the candidate is no fallback of a high-risk flow.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import secrets
from pathlib import Path
from typing import Protocol

from switchyard.db.location import shared_url
from switchyard.gateway.evals import EvalRecord
from switchyard.policy.keys import KeyStore

log = logging.getLogger(__name__)

SIGNING_KEY_FILE = "eval_signing.key"
SIGNING_KEY_SECRET = "eval-signing-key"
_PREFIX = "hmac-sha256:"


class EvalSigningKeyError(Exception):
    """The signing key file exists but does not hold a key (names the file)."""


def signed_bytes(record: EvalRecord) -> bytes:
    """What the signature covers: every field but `signature`, as sorted, compact JSON, so
    YAML layout and key order never matter and no field can change unnoticed."""
    fields = record.model_dump(mode="json", exclude={"signature"})
    return json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _mac(key: bytes, record: EvalRecord) -> str:
    return _PREFIX + hmac.new(key, signed_bytes(record), hashlib.sha256).hexdigest()


class SigningKeySource(Protocol):
    """Where the deployment's signing key lives, as 64 hex digits."""

    where: str  # named in errors

    def read(self) -> str | None:
        """The stored key, or None if none was ever made."""
        ...

    def create(self, candidate: str) -> str:
        """Store `candidate` unless a key exists; return the key stored (of two racing, one)."""
        ...


class FileKey:
    """`<state>/eval_signing.key` (mode 0600): the key on one host."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.where = str(path)

    def read(self) -> str | None:
        try:
            return self.path.read_text().strip()
        except FileNotFoundError:
            return None  # nothing signed here yet

    def create(self, candidate: str) -> str:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole to a private temp file, then linked into place: a concurrent signer either
        # wins the link or reads the winner's key, and no reader ever sees a half-written file.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(candidate + "\n")
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        stored = self.read()
        assert stored is not None
        return stored


class SharedKey:
    """The key in the shared database (`platform_secrets` beside the API keys), so the CLI that
    signs on the head and every replica on every node use one key. A key file this host had
    from before the database is adopted when the shared key is first made."""

    def __init__(self, keys: KeyStore, adopt: Path | None = None) -> None:
        self.keys = keys
        self.adopt = adopt
        self.where = f"the shared database ({SIGNING_KEY_SECRET})"

    def read(self) -> str | None:
        return self.keys.secret(SIGNING_KEY_SECRET)

    def create(self, candidate: str) -> str:
        earlier = FileKey(self.adopt).read() if self.adopt is not None else None
        return self.keys.ensure_secret(SIGNING_KEY_SECRET, earlier or candidate)


class EvalSigner:
    """The deployment's eval signing key: signs records (`eval run`) and checks them (gateway)."""

    def __init__(self, source: SigningKeySource) -> None:
        self.source = source
        self._key: bytes | None = None  # cached once read: the key never changes under a deployment

    @classmethod
    def in_state_dir(cls, state: Path) -> EvalSigner:
        """The shared database's key when there is one (`SWITCHYARD_DATABASE_URL`), else the
        state directory's file."""
        if shared_url() is None:
            return cls(FileKey(state / SIGNING_KEY_FILE))
        return cls(SharedKey(KeyStore.in_state_dir(state), adopt=state / SIGNING_KEY_FILE))

    def sign(self, record: EvalRecord, signed_by: str) -> EvalRecord:
        unsigned = record.model_copy(update={"signed_by": signed_by, "signature": None})
        return unsigned.model_copy(update={"signature": _mac(self._key_or_create(), unsigned)})

    def problem(self, record: EvalRecord) -> str | None:
        """Why the record must not count (a verdict reason), or None when its signature holds."""
        if record.signature is None or record.signed_by is None:
            return "unsigned_eval_record"
        try:
            key = self._read()
        except EvalSigningKeyError as exc:
            log.error("cannot check eval record signatures: %s", exc)
            return "bad_eval_signature"
        if key is None or not hmac.compare_digest(record.signature, _mac(key, record)):
            return "bad_eval_signature"
        return None

    def _read(self) -> bytes | None:
        if self._key is None:
            text = self.source.read()
            if text is None:
                return None
            self._key = _parse(text, self.source.where)
        return self._key

    def _key_or_create(self) -> bytes:
        key = self._read()
        if key is not None:
            return key
        self._key = _parse(self.source.create(secrets.token_hex(32)), self.source.where)
        return self._key


def _parse(text: str, where: str) -> bytes:
    try:
        key = bytes.fromhex(text)
    except ValueError:
        key = b""
    if len(key) < 32:
        raise EvalSigningKeyError(f"{where}: not a signing key (expected 64 hex digits)")
    return key


def signature_problem(record: EvalRecord, signer: EvalSigner | None) -> str | None:
    """`signer` None: the reader has no key to check with, so only an unsigned record is told apart."""
    if signer is not None:
        return signer.problem(record)
    return "unsigned_eval_record" if record.signature is None else "bad_eval_signature"
