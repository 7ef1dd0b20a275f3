"""Collaborators the gateway uses until the budgets (issue 5) and audit (issue 6) packages
provide theirs: real, but process-local and simple. Their limits are stated here, and the
Serve app logs a warning whenever it falls back to them.

- `InMemoryBudgetGate` really reserves and settles against per-team daily limits taken
  from the flow policy (`budget.day_usd`), but the ledger lives in one process.
- `CollectingAuditSink` keeps exchanges in memory (bounded), so it is not durable.
- `PassthroughRedactor` serves data classes with `send: raw` only; it refuses others.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import defaultdict, deque
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from switchyard.gateway.messages import text_chars
from switchyard.gateway.seams import (
    AuditUnavailable,
    Bill,
    CostEstimate,
    Exchange,
    Headroom,
    OverBudget,
    Redacted,
    RedactionSummary,
    RequestContext,
    Reservation,
    StreamRestorer,
    Usage,
)
from switchyard.policy.policy_set import PolicySet


class InMemoryBudgetGate:
    def __init__(self, policies: PolicySet | None = None, chars_per_token: float = 4.0) -> None:
        self.policies = policies
        self.chars_per_token = chars_per_token
        self._lock = asyncio.Lock()
        self.spent: defaultdict[str, float] = defaultdict(float)
        self.held: dict[str, tuple[str, float]] = {}  # reservation id -> (budget key, usd)
        self.held_total: defaultdict[str, float] = defaultdict(float)
        self.settled: deque[tuple[str, float, Usage]] = deque(maxlen=1000)  # recent only: bounded memory
        self.limits: dict[str, float] = {}  # budget key -> the day limit the last reserve saw

    async def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, Any]], max_tokens: int
    ) -> CostEstimate:
        tokens = int(text_chars(messages) / self.chars_per_token) + 1
        usd = 0.0
        if self.policies is not None:
            price = self.policies.providers.models[model].price_on(datetime.now(UTC).date())
            if price is not None:
                usd = (tokens * price.input_per_mtok + max_tokens * price.output_per_mtok) / 1_000_000
        return CostEstimate(model, tokens, max_tokens, usd)

    async def reserve(self, ctx: RequestContext, estimate: CostEstimate) -> Reservation:
        key = f"flow:{ctx.team}/{ctx.flow.flow}:day:{datetime.now(UTC).date()}"
        limit = ctx.flow.budget.day_usd
        if limit is not None:
            self.limits[key] = limit
        async with self._lock:
            held = self.held_total[key]
            if limit is not None and self.spent[key] + held + estimate.usd > limit:
                raise OverBudget(key, self.spent[key] + held, limit, "00:00 UTC")
            rid = uuid.uuid4().hex
            self.held[rid] = (key, estimate.usd)
            self.held_total[key] += estimate.usd
        return Reservation(rid, estimate.usd, (key,))

    async def settle(self, reservation: Reservation, bills: Sequence[Bill]) -> None:
        actual_usd = sum(b.nanos for b in bills) / 1e9
        usage = Usage(
            sum(b.usage.prompt_tokens for b in bills),
            sum(b.usage.completion_tokens for b in bills),
            sum(b.usage.cached_prompt_tokens for b in bills),
        )
        async with self._lock:
            key, usd = self.held.pop(reservation.reservation_id)
            self.held_total[key] -= usd
            self.spent[key] += actual_usd
            self.settled.append((reservation.reservation_id, actual_usd, usage))

    def warnings(self, reservation: Reservation) -> list[str]:
        return []  # soft alerts are the leased gate's (the deployed one)

    def headroom(self, reservation: Reservation) -> Headroom:
        key = self.held.get(reservation.reservation_id, ("", 0.0))[0]
        limit = self.limits.get(key)  # the flow's day limit, as reserve saw it
        return Headroom(None if limit is None else max(limit - self.spent[key] - self.held_total[key], 0.0))

    async def release(self, reservation: Reservation) -> None:
        async with self._lock:
            key, usd = self.held.pop(reservation.reservation_id, ("", 0.0))
            self.held_total[key] -= usd


class CollectingAuditSink:
    def __init__(self, keep: int = 1000, fail_durable: bool = False) -> None:
        self.exchanges: deque[Exchange] = deque(maxlen=keep)
        self.fail_durable = fail_durable  # tests: the durable store is down

    async def record(
        self, exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        """In memory: nothing waits, and a record refused (`fail_durable`) is not kept."""
        if durable and self.fail_durable:
            raise AuditUnavailable("the durable audit store is not reachable")
        self.exchanges.append(exchange)

    async def open_stream(self, stand_in: Exchange, durable: bool) -> None:
        """In memory, a stand-in outlives nothing: there is nothing to keep."""
        if durable and self.fail_durable:
            raise AuditUnavailable("the durable audit store is not reachable")


class _IdentityRestorer:
    def feed(self, chunk: str) -> str:
        return chunk

    def flush(self) -> str:
        return ""


class RedactionUnavailable(Exception):
    """A data class needs redaction and no redactor is installed: the request must not leave."""


class PassthroughRedactor:
    def __init__(self, policies: PolicySet | None = None, strict: bool = True) -> None:
        self.policies = policies
        self.strict = strict  # False: tests that exercise routing on `send: redacted` flows

    def redact(self, messages: list[dict[str, Any]], data_class: str) -> Redacted:
        if self.strict and self.policies is not None and self.policies.data.classes[data_class].send != "raw":
            raise RedactionUnavailable(
                f"data class {data_class!r} must be redacted before sending, and no redactor is installed"
            )
        return Redacted(messages, RedactionSummary("none"))

    def restorer(self, redacted: Redacted) -> StreamRestorer:
        return _IdentityRestorer()
