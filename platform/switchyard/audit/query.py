"""Role-checked reads of the audit log. Team admins see their team; auditors see all.

Bodies are returned only to roles the record's data class lists in `body_readers`, and
every read that returns bodies appends an `AccessRecord` to the chain first, durably.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography.exceptions import InvalidTag

from switchyard.audit.data_policy import DataPolicySource, as_getter, may_read_bodies
from switchyard.audit.record import AccessRecord, RequestRecord
from switchyard.audit.store import AuditStore, StoredEntry
from switchyard.audit.subject_keys import KeyErased, SubjectKeyring, plain_digest, unseal
from switchyard.policy.keys import Principal
from switchyard.policy.models import BodyStorage
from switchyard.policy.roles import Action, authorize


@dataclass(frozen=True)
class AuditQuery:
    team: str | None  # None: every team (auditors and platform admins only)
    flow: str | None = None
    since: float | None = None
    with_bodies: bool = False
    limit: int = 1000


class AuditReader:
    def __init__(self, store: AuditStore, keyring: SubjectKeyring, policies: DataPolicySource) -> None:
        self._store = store
        self._keyring = keyring
        self._policies = as_getter(policies)

    def query(self, who: Principal, q: AuditQuery) -> list[dict[str, Any]]:
        """Raises `Forbidden` before reading anything the principal may not see."""
        authorize(who, Action.READ_AUDIT, q.team)
        found = self._store.find(q.team, q.flow, q.since, q.limit)
        readable = [e for e in found if q.with_bodies and self._may_read(who, e)]
        if readable:
            self._store.append([self._access(who, q, readable)])
        readable_ids = {e.entry.request_id for e in readable}
        return [self._view(e, e.entry.request_id in readable_ids) for e in found]

    def _may_read(self, who: Principal, stored: StoredEntry) -> bool:
        entry = stored.entry
        if not isinstance(entry, RequestRecord):
            return False
        cls = self._policies().classes.get(entry.data_class)
        return cls is not None and may_read_bodies(cls, who.role)

    @staticmethod
    def _access(who: Principal, q: AuditQuery, readable: list[StoredEntry]) -> AccessRecord:
        return AccessRecord(
            request_id=f"access-{uuid.uuid4().hex}",
            time=time.time(),
            reader_key_id=who.key_id,
            reader_role=who.role,
            reader_team=who.team,
            team=q.team,
            flow=q.flow,
            bodies_of=tuple(e.entry.request_id for e in readable),
        )

    def _view(self, stored: StoredEntry, with_bodies: bool) -> dict[str, Any]:
        view: dict[str, Any] = {
            "seq": stored.seq,
            "hash": stored.hash,
            **stored.entry.model_dump(mode="json"),
        }
        if with_bodies and isinstance(stored.entry, RequestRecord):
            view["bodies"] = {part: self._body_text(stored.entry, part) for part in ("input", "output")}
        return view

    def _body_text(self, record: RequestRecord, part: str) -> str | None:
        """The stored text, or why there is none (bracketed, so it cannot pass for a body)."""
        meta = record.input if part == "input" else record.output
        if meta.storage in (BodyStorage.NONE, BodyStorage.HASH):
            return f"[{meta.storage.value}]"
        data = self._store.body(record.request_id, part)
        if data is None:
            return "[removed by retention]"
        if plain_digest(data) != meta.digest:  # an edit `audit verify` would report: never shown as the body
            return "[edited: does not match the digest its record carries]"
        if not meta.encrypted:
            return data.decode()
        try:
            key = self._keyring.key_by_id(meta.key_id or "")
            return unseal(key, data, f"{record.request_id}/{part}")
        except KeyErased:
            return "[erased]"
        except InvalidTag:
            return "[unreadable: does not decrypt under its key]"


_RELATIVE = {"s": 1, "m": 60, "h": 3600, "d": 86_400}


def parse_since(text: str, now: float | None = None) -> float:
    """`--since`: unix seconds, an ISO 8601 time (UTC if no zone), or an age like 30m, 24h, 7d."""
    text = text.strip()
    age = _AGE.fullmatch(text)
    if age is not None:
        return (time.time() if now is None else now) - int(age[1]) * _RELATIVE[age[2]]
    if _UNIX.fullmatch(text):
        return float(text)
    try:
        parsed = datetime.fromisoformat(text) if text.isascii() else None
    except ValueError:
        parsed = None
    if parsed is None:
        # The value is not echoed: error bodies and logs must never carry request content.
        raise ValueError(
            "since: expected unix seconds, an ISO 8601 time, or an age like 24h or 7d of at most "
            f"{_MAX_AGE_DIGITS} digits (got {len(text)} characters that are none of these)"
        )
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()


_MAX_AGE_DIGITS = 6  # 999999d is ~2,700 years: any longer is a typo, and would overflow a float
_AGE = re.compile(rf"([0-9]{{1,{_MAX_AGE_DIGITS}}})([smhd])", re.ASCII)
_UNIX = re.compile(r"[0-9]{1,11}(\.[0-9]{1,9})?", re.ASCII)
