"""Eval records signed by the operator who ran them: HMAC-SHA256 with `<state>/eval_signing.key`.

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

from switchyard.gateway.evals import EvalRecord

log = logging.getLogger(__name__)

SIGNING_KEY_FILE = "eval_signing.key"
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


class EvalSigner:
    """The state directory's eval signing key: signs records (`eval run`) and checks them (gateway)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._key: bytes | None = None  # cached once read: the key never changes under a deployment

    @classmethod
    def in_state_dir(cls, state: Path) -> EvalSigner:
        return cls(state / SIGNING_KEY_FILE)

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
            try:
                text = self.path.read_text().strip()
            except FileNotFoundError:
                return None  # nothing signed here yet
            try:
                key = bytes.fromhex(text)
            except ValueError:
                key = b""
            if len(key) < 32:
                raise EvalSigningKeyError(f"{self.path}: not a signing key (expected 64 hex digits)")
            self._key = key
        return self._key

    def _key_or_create(self) -> bytes:
        key = self._read()
        if key is not None:
            return key
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # Written whole to a private temp file, then linked into place: a concurrent signer either
        # wins the link or reads the winner's key, and no reader ever sees a half-written file.
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.{secrets.token_hex(4)}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32) + "\n")
        try:
            os.link(tmp, self.path)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
        key = self._read()
        assert key is not None
        return key


def signature_problem(record: EvalRecord, signer: EvalSigner | None) -> str | None:
    """`signer` None: the reader has no key to check with, so only an unsigned record is told apart."""
    if signer is not None:
        return signer.problem(record)
    return "unsigned_eval_record" if record.signature is None else "bad_eval_signature"
