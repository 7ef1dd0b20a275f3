"""The audit record: one per request, versioned, and the record of each read of bodies.

Records are the chained payload: their canonical JSON is what the hash chain covers.
Bodies are not in the record (only their digests), so retention and erasure can remove
bodies while every record and every link still verifies. Nor is the id of the user a team
sent: from schema 2 on, `user` and `subject` are pseudonyms under the subject's key
(`subject_keys.pseudonym`), which erasure deletes.
"""

from __future__ import annotations

import json
from typing import Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchyard.policy.models import BodyStorage, ErrorClass, RiskTier, Role

# 3: an attempt says whether its usage was read, a bill what it was charged at;
# 2: `user` and `subject` are pseudonyms; 1 carried them as sent
SCHEMA_VERSION: Final = 3


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AttemptRecord(_Frozen):
    provider: str
    model: str
    model_version: str
    started_at: float
    latency_ms: float
    error_class: ErrorClass | None = None
    error: str | None = None
    fallback_reason: str | None = None
    billed_unknown: bool = False  # the provider may have billed it, and its usage was not read


class Tokens(_Frozen):
    prompt: int = 0
    completion: int = 0
    cached_prompt: int = 0


class RedactionRecord(_Frozen):
    mode: Literal["none", "reversible", "irreversible"]  # what was sent to the provider
    entity_counts: dict[str, int] = {}  # found in what was sent
    stored_entity_counts: dict[str, int] = {}  # removed from the stored bodies


class StoredBody(_Frozen):
    """What the store keeps of one body; `digest` lets verify detect an edited body."""

    storage: BodyStorage
    digest: str | None = None  # "sha256:<hex>" of the stored bytes, or "hmac-sha256:<hex>" (hash mode)
    encrypted: bool = False
    key_id: str | None = None  # the subject key that encrypts it (erasure deletes the key)


class BillRecord(_Frozen):
    """One billed attempt: the model and what it was charged for. A request's bills sum to
    its `cost_usd`, and over the log they equal the gateway's token and cost counters."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    cost_usd: float
    # "reported": at the provider's usage; "bound": its usage was not read, so the documented
    # upper bound; "held": the whole reservation (a stream's stand-in). None: not known (a
    # record before schema 3, or a recovered stream's charge, which the ledger keeps without it).
    basis: Literal["reported", "bound", "held"] | None = None


class SkipRecord(_Frozen):
    """A candidate of the route that was not tried, and why (policy or a missing capability)."""

    model: str
    reason: str


class RequestRecord(_Frozen):
    schema_version: Literal[1, 2, 3] = SCHEMA_VERSION
    kind: Literal["request"] = "request"
    request_id: str
    time: float  # unix seconds the request was received
    team: str
    user: str | None  # the subject's pseudonym when the request named a user, else None
    subject: str  # pseudonym of the subject whose key seals the bodies: "<team>/<user>", or "<team>/"
    flow: str
    risk_tier: RiskTier
    data_class: str
    prompt_ref: str  # id@version#hash12
    requested_model: str
    provider: str | None
    model_version: str | None
    attempts: tuple[AttemptRecord, ...]
    tokens: Tokens | None
    cost_usd: float
    latency_ms: float
    status_code: int
    error_code: str | None
    budget_decision: str
    redaction: RedactionRecord
    input: StoredBody
    output: StoredBody
    body_expires_at: float  # after this the bodies are removed; the record stays
    idempotency_key: str | None
    contract_result: Literal["valid", "invalid", "not_declared", "not_reached"]
    skipped: tuple[SkipRecord, ...] = ()
    bills: tuple[BillRecord, ...] = ()


class AccessRecord(_Frozen):
    """Reading bodies is itself audited: one record per query that returned bodies."""

    schema_version: Literal[1] = 1
    kind: Literal["access"] = "access"
    request_id: str  # "access-<uuid>": unique like a request's id
    time: float
    reader_key_id: str
    reader_role: Role
    reader_team: str
    team: str | None  # the team queried; None for all teams
    flow: str | None
    bodies_of: tuple[str, ...] = Field(default=())  # request ids whose bodies were returned


class ErasureRecord(_Frozen):
    """A subject's key was deleted: its bodies are unreadable from this point in the chain,
    and the pseudonym its records carry is no longer linkable to anyone."""

    schema_version: Literal[1, 2] = 2
    kind: Literal["erasure"] = "erasure"
    request_id: str  # "erasure-<uuid>"
    time: float
    team: str
    flow: None = None
    subject: str | None  # the erased pseudonym; None when the subject had no key
    erased_by: str  # the key id that asked
    key_existed: bool
    replays_purged: int | None = None  # stored idempotent answers deleted; None: no store reached
    bodies_removed: tuple[str, ...] = ()  # request ids of schema-1 plaintext bodies it deleted


AuditEntry = RequestRecord | AccessRecord | ErasureRecord


def canonical_json(entry: AuditEntry) -> str:
    """The bytes the chain hashes: sorted keys, no whitespace, so they never depend on order."""
    return json.dumps(entry.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))


class UnreadableEntry(ValueError):
    """A stored payload that is not an audit entry: only an edit of the database makes one."""


def parse_entry(payload: str) -> AuditEntry:
    """The entry `payload` holds; raises `UnreadableEntry` naming what is wrong with it."""
    try:
        data = json.loads(payload)
        if not isinstance(data, dict):
            raise UnreadableEntry(f"a JSON {type(data).__name__}, not an object")
        if data.get("kind") == "access":
            return AccessRecord.model_validate(data)
        if data.get("kind") == "erasure":
            return ErasureRecord.model_validate(data)
        return RequestRecord.model_validate(data)
    except json.JSONDecodeError as exc:
        raise UnreadableEntry(f"not JSON ({exc})") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "the record"
        raise UnreadableEntry(f"{where}: {first['msg']} ({exc.error_count()} problems)") from None
