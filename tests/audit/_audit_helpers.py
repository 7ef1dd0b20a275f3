"""Test data for the audit tests: raw personal values and Exchange factories."""

from __future__ import annotations

import time
import uuid
from typing import Any

from switchyard.gateway.seams import Attempt, Exchange, RedactionSummary, RequestContext, Usage
from switchyard.policy.models import EffectiveFlow, RiskTier

# Raw personal values used across the tests; none may survive anywhere stored or logged.
EMAIL = "jane.doe@example.com"
PHONE = "+1 415-555-0132"
CARD = "4111 1111 1111 1111"
IBAN = "GB82 WEST 1234 5698 7654 32"
SSN = "219-09-9999"
PERSONAL_TEXT = f"Hi, I'm Jane ({EMAIL}, {PHONE}). Card {CARD}, IBAN {IBAN}, SSN {SSN}."
RAW_VALUES = (EMAIL, PHONE, CARD, IBAN, SSN)


def make_flow(
    team: str = "support",
    flow: str = "reply",
    data_class: str = "personal",
    risk: RiskTier = RiskTier.MEDIUM,
    retention_days: int = 90,
) -> EffectiveFlow:
    return EffectiveFlow(
        team=team,
        flow=flow,
        prompt="support-reply@2",
        risk_tier=risk,
        data_class=data_class,
        deadline_ms=15000,
        max_tokens=512,
        model="gpt-4o-mini",
        allowed_providers=frozenset({"openai"}),
        retention_days=retention_days,
    )


def make_exchange(
    flow: EffectiveFlow | None = None,
    user: str | None = "u-42",
    text: str = PERSONAL_TEXT,
    output: str | None = None,
    request_id: str | None = None,
    received_at: float | None = None,
    cost_usd: float = 0.0012,
    **overrides: Any,
) -> Exchange:
    flow = flow or make_flow()
    ctx = RequestContext(
        request_id=request_id or f"req-{uuid.uuid4().hex[:12]}",
        received_at=received_at if received_at is not None else time.time(),
        started=time.monotonic(),
        team=flow.team,
        key_id="k1",
        user=user,
        flow=flow,
        requested_model="auto",
        prompt_ref="support-reply@2#abcdef123456",
        idempotency_key="idem-1",
        deadline=time.monotonic() + 15,
        stream=False,
    )
    fields: dict[str, Any] = dict(
        ctx=ctx,
        status_code=200,
        input_messages=[{"role": "system", "content": "Be kind."}, {"role": "user", "content": text}],
        output_text=output if output is not None else f"We will email you at {EMAIL}.",
        attempts=(
            Attempt(
                "openai",
                "gpt-4o-mini",
                "gpt-4o-mini-2024-07-18",
                time.time(),
                120.0,
                error_class=None,
                error=None,
                fallback_reason=None,
            ),
        ),
        provider="openai",
        model_version="gpt-4o-mini-2024-07-18",
        usage=Usage(prompt_tokens=40, completion_tokens=12),
        cost_usd=cost_usd,
        latency_ms=130.0,
        budget_decision="reserved",
        redaction=RedactionSummary(mode="reversible", entity_counts={"EMAIL_ADDRESS": 1}),
        contract_result="not_declared",
    )
    fields.update(overrides)
    return Exchange(**fields)
