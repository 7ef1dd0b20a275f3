"""The gateway core's seams: the interfaces it calls for money, data protection and records.

The request pipeline (`switchyard.gateway`) knows these protocols only. Implementations live
in their own packages (`switchyard.budgets`, `switchyard.audit`) and are chosen when the
gateway is built, so the core runs in-process in tests and benchmarks and unchanged in Serve.
Everything that crosses a seam is a frozen value object defined here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any, Literal, Protocol

from switchyard.policy.models import EffectiveFlow, ErrorClass

# ---------------------------------------------------------------- what a request is


@dataclass(frozen=True)
class RequestContext:
    """Everything known about a request before any provider is called."""

    request_id: str
    received_at: float  # unix seconds (wall clock): the record's time, the day of prices and budgets
    # Durations and deadlines count on the gateway's monotonic timer (`GatewayParts.timer`), not
    # the wall clock: an NTP step or a resumed VM moves the wall clock by seconds to hours, which
    # would time out requests in flight or record negative latencies.
    started: float  # the timer at receipt
    team: str
    key_id: str
    user: str | None  # the end user the team names (OpenAI's `user` field), if any
    flow: EffectiveFlow
    requested_model: str  # "auto" or a model name the flow allows
    prompt_ref: str  # "id@version#hash12"
    idempotency_key: str | None
    deadline: float  # on the timer: `started` + the flow's deadline, possibly shortened by the client
    stream: bool

    @property
    def deadline_s(self) -> float:
        """The request's whole time budget, in seconds."""
        return self.deadline - self.started

    @property
    def day(self) -> date:
        """The UTC day the request arrived: the day whose prices and budget periods apply."""
        return datetime.fromtimestamp(self.received_at, UTC).date()


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0


@dataclass(frozen=True)
class Attempt:
    """One call to one provider, successful or not."""

    provider: str
    model: str  # catalog name
    model_version: str  # the provider's id
    started_at: float
    latency_ms: float
    error_class: ErrorClass | None = None
    error: str | None = None  # never contains request content or credentials
    fallback_reason: str | None = None  # why the *next* attempt happened, if one did
    usage: Usage | None = None  # what the provider billed, when it answered (valid or not)
    billed_unknown: bool = False
    """It answered without usage the gateway read: billed at the bound. That bound is `usage`
    where the gateway set one (a stream's, from what it streamed), else the input and all of
    `max_tokens`."""


# ---------------------------------------------------------------- budgets


@dataclass(frozen=True)
class CostEstimate:
    """What a request may cost. `usd` is what is held; `nanos` the same, exactly, when known."""

    model: str
    input_tokens: int
    max_output_tokens: int
    usd: float
    nanos: int | None = None


BillBasis = Literal["reported", "bound", "held"]
"""What a bill was charged at: the usage the provider reported; the documented upper bound,
where its usage was not read; or the whole reservation, held for a stream whose replica may
die before it settles (its stand-in record's bill)."""


@dataclass(frozen=True)
class Bill:
    """One attempt a provider billed: its model (catalog name), usage and cost."""

    model: str
    usage: Usage
    nanos: int
    basis: BillBasis | None = "reported"  # None: not known (a charge read back from the ledger)


@dataclass(frozen=True)
class Reservation:
    """Money held on every applicable budget at once, before any provider is called."""

    reservation_id: str
    usd: float
    budgets: tuple[str, ...]  # the budget keys held, e.g. ("org:acme:month:2026-11", ...)


class OverBudget(Exception):
    """A hard limit would be exceeded. Maps to HTTP 402; names the budget, not the request."""

    def __init__(
        self,
        budget: str,
        committed_usd: float,
        limit_usd: float,
        resets_at: str,
        *,
        spent_usd: float | None = None,
        needed_usd: float | None = None,
    ) -> None:
        self.budget, self.committed_usd, self.limit_usd, self.resets_at = budget, committed_usd, limit_usd, resets_at
        self.spent_usd = committed_usd if spent_usd is None else spent_usd
        held = committed_usd - self.spent_usd
        needs = "" if needed_usd is None else f" needs ${needed_usd:.6g} (its whole chain, fallbacks included);"
        super().__init__(
            # `g` formats: a $0.00001 budget reads as such, not as $0.00.
            f"budget {budget} (limit ${limit_usd:.6g}) cannot fit this request:{needs} ${self.spent_usd:.6g} spent"
            f" and ${held:.6g} held by requests in flight; resets at {resets_at}"
        )


@dataclass(frozen=True)
class Headroom:
    """What a team has left, as of the ledger's last answer to this replica: the least USD left
    on the request's budget lines (this request's hold counted as spent) and the permits
    left on its tightest request and token rate limits. None: no such limit applies."""

    budget_usd: float | None = None
    requests: int | None = None
    tokens: int | None = None


class BudgetUnavailable(Exception):
    """The ledger could not be reached in time. Nothing was reserved or charged: HTTP 503
    with Retry-After, never a 500 and never a call the budget does not cover."""


class RateLimited(Exception):
    """A request or token rate limit was hit. Maps to HTTP 429 with Retry-After."""

    def __init__(self, limit: str, retry_after_s: float) -> None:
        self.limit, self.retry_after_s = limit, retry_after_s
        super().__init__(f"rate limit {limit} reached; retry after {retry_after_s:.1f}s")


class BudgetGate(Protocol):
    """Reserve before calling a provider, settle to the actual cost after, release on failure."""

    async def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, Any]], max_tokens: int
    ) -> CostEstimate: ...

    async def reserve(self, ctx: RequestContext, estimate: CostEstimate) -> Reservation:
        """All or nothing over every applicable budget; raises OverBudget or RateLimited."""
        ...

    async def settle(self, reservation: Reservation, bills: Sequence[Bill]) -> None:
        """Charge what the providers billed (one bill per billed attempt, at least one) and
        free the rest of the reservation."""
        ...

    async def release(self, reservation: Reservation) -> None: ...

    def warnings(self, reservation: Reservation) -> list[str]:
        """Soft-alert thresholds (`budget.soft_alerts`) the reservation's lines have passed."""
        ...

    def headroom(self, reservation: Reservation) -> Headroom:
        """What is left once this reservation is held (call before settling or releasing it)."""
        ...


# ---------------------------------------------------------------- redaction


@dataclass(frozen=True)
class RedactionSummary:
    mode: Literal["none", "reversible", "irreversible"]
    entity_counts: dict[str, int] = field(default_factory=dict)  # e.g. {"EMAIL_ADDRESS": 2}


@dataclass(frozen=True)
class Redacted:
    messages: list[dict[str, Any]]
    summary: RedactionSummary
    restore: dict[str, str] = field(default_factory=dict)  # placeholder -> original (reversible only)


class Redactor(Protocol):
    def redact(self, messages: list[dict[str, Any]], data_class: str) -> Redacted:
        """Redact per the data class's `send` rule. Must not download anything."""
        ...

    def restorer(self, redacted: Redacted) -> StreamRestorer:
        """Restores placeholders in the answer, chunk by chunk (placeholders may straddle chunks)."""
        ...


class StreamRestorer(Protocol):
    def feed(self, chunk: str) -> str: ...

    def flush(self) -> str: ...


# ---------------------------------------------------------------- audit


@dataclass(frozen=True)
class Exchange:
    """What happened to one request, handed to the audit sink once the outcome is known."""

    ctx: RequestContext
    status_code: int
    input_messages: list[dict[str, Any]]  # as rendered, before redaction (OpenAI chat format)
    output_text: str | None
    attempts: tuple[Attempt, ...]
    provider: str | None  # the provider that answered, if any
    model_version: str | None
    usage: Usage | None
    cost_usd: float
    latency_ms: float
    budget_decision: str  # "reserved", "over_budget:<budget>", "rate_limited:<limit>", "not_reached"
    redaction: RedactionSummary
    contract_result: Literal["valid", "invalid", "not_declared", "not_reached"]
    error_code: str | None = None
    output_tool_calls: tuple[dict[str, Any], ...] = ()  # OpenAI tool-call objects of the answer
    skipped: tuple[tuple[str, str], ...] = ()  # (model, reason) of candidates not tried
    bills: tuple[Bill, ...] = ()  # what was charged, one per billed attempt (sums to cost_usd)


AUDIT_UNAVAILABLE = "audit_unavailable"  # the error code of an answer withheld for want of its record
# A commit takes milliseconds: the floor keeps an answer that came just before its deadline from
# being withheld by a healthy store.
MIN_RECORD_WAIT_S = 1.0


def record_wait_s(ctx: RequestContext, now: float) -> float:
    """How long an answer waits for its durable record (`AuditSink.record`'s `within_s`): until
    the request's deadline, and at least `MIN_RECORD_WAIT_S` (`now` on the gateway's timer)."""
    return max(ctx.deadline - now, MIN_RECORD_WAIT_S)


class AuditUnavailable(Exception):
    """The durable store cannot take a record; high-risk flows fail closed (HTTP 503)."""


class AuditSink(Protocol):
    async def record(
        self, exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        """`durable=True` returns only once the record is on stable storage (high-risk flows);
        otherwise it may be queued, within the sink's stated loss bound. It supersedes the
        request's stand-in, if it has one.

        A durable record the store cannot take, or has not taken within `within_s` seconds,
        raises `AuditUnavailable` (a transaction already under way is waited for: the store's
        lock timeout bounds it). The sink then keeps the record for the store's return where
        it can: as it is, or, when the caller `withholds` its answer for want of the record,
        as what the caller is answered instead: a 503 `AUDIT_UNAVAILABLE`, with the model's
        output, which was produced and billed, only not sent."""
        ...

    async def open_stream(self, stand_in: Exchange, durable: bool) -> None:
        """Before a stream's first byte: `stand_in` is the record the request gets if this
        replica dies before `record` (the stream cut off by the replica's loss). Raises
        `AuditUnavailable` when it cannot be kept; the stream must then not start."""
        ...
