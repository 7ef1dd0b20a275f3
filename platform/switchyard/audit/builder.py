"""Turns an `Exchange` into an audit record and its stored bodies, per the flow's data class.

This is where the data policy decides what is kept: full text, redacted text, a keyed hash,
or nothing. Whatever the class, a stored body is sealed under the subject's key and the
record names the user only by the subject's pseudonym, so erasing the key leaves nothing
of the subject readable or linkable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from switchyard.audit.data_policy import DataPolicySource, as_getter
from switchyard.audit.record import (
    AttemptRecord,
    BillRecord,
    RedactionRecord,
    RequestRecord,
    SkipRecord,
    StoredBody,
    Tokens,
)
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.subject_keys import (
    SubjectKeyring,
    keyed_digest,
    plain_digest,
    pseudonym,
    seal,
    subject_of,
)
from switchyard.budgets.money import nanos_to_usd
from switchyard.gateway.messages import map_text
from switchyard.gateway.seams import AUDIT_UNAVAILABLE, Bill, Exchange
from switchyard.policy.models import BodyStorage, DataClass

DAY_S = 86_400


def bill_record(bill: Bill) -> BillRecord:
    """How a billed attempt is recorded."""
    usage = bill.usage
    return BillRecord(
        model=bill.model,
        prompt_tokens=usage.prompt_tokens,
        completion_tokens=usage.completion_tokens,
        cached_prompt_tokens=usage.cached_prompt_tokens,
        cost_usd=nanos_to_usd(bill.nanos),
        basis=bill.basis,
    )


@dataclass(frozen=True)
class BodyBlob:
    """The bytes stored for one body (already redacted and/or encrypted as the policy says)."""

    part: str  # "input" | "output"
    data: bytes


@dataclass(frozen=True)
class PendingEntry:
    record: RequestRecord
    bodies: tuple[BodyBlob, ...]

    def withheld(self) -> PendingEntry:
        """The record of this answer withheld for want of it being stored: what its caller got,
        a 503 `audit_unavailable`, with the model's output (produced and billed, only not sent).
        Derived, not built again: a build reads the subject's key, from a database that may be
        the very one failing."""
        record = self.record.model_copy(update={"status_code": 503, "error_code": AUDIT_UNAVAILABLE})
        return PendingEntry(record, self.bodies)


class RecordBuilder:
    def __init__(self, policies: DataPolicySource, scrubber: TextScrubber, keyring: SubjectKeyring) -> None:
        self._policies = as_getter(policies)
        self._scrubber = scrubber
        self.keyring = keyring

    def data_class(self, name: str) -> DataClass:
        cls = self._policies().classes.get(name)
        if cls is None:
            raise KeyError(f"data class {name!r} is not defined in data_policies.yaml")
        return cls

    def build(self, exchange: Exchange) -> PendingEntry:
        ctx = exchange.ctx
        cls = self.data_class(ctx.flow.data_class)
        subject = subject_of(ctx.team, ctx.user)
        counts: dict[str, int] = {}
        inputs = [images_by_digest(m) for m in exchange.input_messages]
        if cls.store_input is BodyStorage.REDACTED:
            inputs = [map_text(m, lambda text: self._scrub(text, counts)) for m in inputs]
        input_text = json.dumps(inputs, ensure_ascii=False, sort_keys=True)
        output_text = exchange.output_text
        calls = list(exchange.output_tool_calls)
        if cls.store_output is BodyStorage.REDACTED:
            if output_text is not None:
                output_text = self._scrub(output_text, counts)
            calls = map_text({"tool_calls": calls}, lambda text: self._scrub(text, counts)).get("tool_calls", [])
        if calls:
            # An answer that calls tools is stored as the message it was: its text and its calls.
            output_text = json.dumps({"content": output_text, "tool_calls": calls}, ensure_ascii=False, sort_keys=True)
        bodies: list[BodyBlob] = []
        key = self.keyring.key_for(subject)  # one key read per record
        alias = pseudonym(key[1], subject)
        stored_in = self._store(ctx.request_id, "input", input_text, cls.store_input, key, bodies)
        stored_out = self._store(ctx.request_id, "output", output_text, cls.store_output, key, bodies)
        retention_days = min(cls.retention_days, ctx.flow.retention_days)
        record = RequestRecord(
            request_id=ctx.request_id,
            time=ctx.received_at,
            team=ctx.team,
            user=None if ctx.user is None else alias,
            subject=alias,
            flow=ctx.flow.flow,
            risk_tier=ctx.flow.risk_tier,
            data_class=ctx.flow.data_class,
            prompt_ref=ctx.prompt_ref,
            requested_model=ctx.requested_model,
            provider=exchange.provider,
            model_version=exchange.model_version,
            attempts=tuple(
                AttemptRecord(
                    provider=a.provider,
                    model=a.model,
                    model_version=a.model_version,
                    started_at=a.started_at,
                    latency_ms=a.latency_ms,
                    error_class=a.error_class,
                    error=a.error,
                    fallback_reason=a.fallback_reason,
                    billed_unknown=a.billed_unknown,
                )
                for a in exchange.attempts
            ),
            tokens=None
            if exchange.usage is None
            else Tokens(
                prompt=exchange.usage.prompt_tokens,
                completion=exchange.usage.completion_tokens,
                cached_prompt=exchange.usage.cached_prompt_tokens,
            ),
            cost_usd=exchange.cost_usd,
            latency_ms=exchange.latency_ms,
            status_code=exchange.status_code,
            error_code=exchange.error_code,
            budget_decision=exchange.budget_decision,
            redaction=RedactionRecord(
                mode=exchange.redaction.mode,
                entity_counts=dict(exchange.redaction.entity_counts),
                stored_entity_counts=counts,
            ),
            input=stored_in,
            output=stored_out,
            body_expires_at=ctx.received_at + retention_days * DAY_S,
            idempotency_key=ctx.idempotency_key,
            contract_result=exchange.contract_result,
            skipped=tuple(SkipRecord(model=m, reason=r) for m, r in exchange.skipped),
            bills=tuple(bill_record(b) for b in exchange.bills),
        )
        return PendingEntry(record, tuple(bodies))

    def _scrub(self, text: str, counts: dict[str, int]) -> str:
        scrubbed, found = self._scrubber.scrub_text(text)
        for entity, n in found.items():
            counts[entity] = counts.get(entity, 0) + n
        return scrubbed

    def _store(
        self,
        request_id: str,
        part: str,
        text: str | None,
        storage: BodyStorage,
        subject_key: tuple[str, bytes],
        bodies: list[BodyBlob],
    ) -> StoredBody:
        if text is None or storage is BodyStorage.NONE:
            return StoredBody(storage=BodyStorage.NONE)
        key_id, key = subject_key
        if storage is BodyStorage.HASH:
            return StoredBody(storage=storage, digest=keyed_digest(key, text), key_id=key_id)
        # Sealed whatever the class's `encrypt_bodies` says: a plaintext body would outlive
        # the erasure of its subject.
        data = seal(key, text, f"{request_id}/{part}")
        bodies.append(BodyBlob(part, data))
        return StoredBody(storage=storage, digest=plain_digest(data), encrypted=True, key_id=key_id)


def images_by_digest(message: dict[str, Any]) -> dict[str, Any]:
    """An image is recorded by its sha256, media type and size, not its bytes: the record
    proves which image was sent without the audit store keeping every upload (a data URL can
    be 20 MB). An https URL is kept as sent, under the same storage rule as the text."""
    content = message.get("content")
    if not isinstance(content, list):
        return message
    parts = []
    for part in content:
        url = part.get("image_url", {}).get("url", "") if part.get("type") == "image_url" else ""
        if url.startswith("data:"):
            head, _, data = url.partition(",")
            digest = hashlib.sha256(data.encode()).hexdigest()
            part = {"type": "image_url", "image_url": {"url": f"{head},<sha256:{digest} {len(data)} base64 chars>"}}
        parts.append(part)
    return {**message, "content": parts}
