"""`POST /v1/embeddings` under the governance of chat: the caller's key and flow, the flow's
models and providers, prices, budgets and rate limits, redaction per data class, admission
control, one audit record per request, and metrics.

The path: authenticate -> resolve the flow -> its model (`auto` is the flow's `model`; any
other must be one the flow allows, and it must be an embedding model on an allowed provider
with the compliance tags the data class requires) -> admission control -> redact the inputs
-> reserve their cost -> call the provider within the deadline (a retryable failure is
retried once, on the same model) -> settle -> audit -> answer in OpenAI's shape.

**No fallback, ever.** Vectors of different models live in different spaces: a fallback
model's vectors would be stored in the team's index beside the primary's and compared with
them, and every similarity they took part in would be wrong, silently. So a flow's
`fallback` list plays no part here and `x-switchyard-fallback` is always `none`: when the
model cannot answer, the client gets the error (and may retry), as on a flow without fallback.

**What is charged.** Input tokens at the model's input price; there is no output. The hold is
`input_tokens_bound`, an upper bound in every tokenizer family; the charge is the count the
provider reports, or that bound when it reports none or the call was cut off (a timeout, a
client that hung up): the provider may have billed the whole input.

**What is audited.** The inputs as messages (`{"role": "user", "content": text}`), stored as
the flow's data class stores prompts (full, redacted, hashed or not at all), and no output:
vectors are not stored. They are the team's data rather than a record of what was said, and
they can be inverted to approximate their text, so storing them would keep the input in a
form the data class's rules do not see.
"""

from __future__ import annotations

import asyncio
import logging
import math
import uuid
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from typing import Any, TypeVar

from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.pricing import UnknownPrice, entry_price
from switchyard.budgets.tokens import EXACT_FAMILIES, OUTPUT_SPECIAL_TOKENS, count_input_tokens
from switchyard.gateway.admission_control import Shed
from switchyard.gateway.attempts import ChainLog
from switchyard.gateway.billing import bill, total_usd
from switchyard.gateway.capabilities import Needs
from switchyard.gateway.embedding_attempts import EmbeddingCaller
from switchyard.gateway.embedding_wire import EmbeddingRequest, embeddings_body, parse_embedding_request
from switchyard.gateway.errors import (
    BadRequest,
    DeadlineExceeded,
    GatewayError,
    PaymentRequired,
    TooManyRequests,
    Unavailable,
    internal_error,
)
from switchyard.gateway.evals import EvalVerdict
from switchyard.gateway.outcome import Outcome, cut_short
from switchyard.gateway.owned_tasks import OwnedTasks
from switchyard.gateway.pipeline import GatewayParts
from switchyard.gateway.planning import IDEMPOTENCY_HEADER, FlowCache, deadline_ms
from switchyard.gateway.providers.base import Embeddings, ProviderError
from switchyard.gateway.providers.embedding_registry import EmbedderPool
from switchyard.gateway.redaction_pool import RedactionPool
from switchyard.gateway.results import (
    H_BUDGET_WARNING,
    H_FALLBACK,
    H_MODEL,
    H_PROMPT,
    H_PROVIDER,
    H_REQUEST_ID,
    H_SDK_REQUEST_ID,
    JSONResult,
    error_result,
)
from switchyard.gateway.routing import Candidate, pick_primary, plan_route
from switchyard.gateway.seams import (
    AUDIT_UNAVAILABLE,
    AuditUnavailable,
    Bill,
    BudgetUnavailable,
    CostEstimate,
    Exchange,
    OverBudget,
    RateLimited,
    RedactionSummary,
    RequestContext,
    Reservation,
    Usage,
    record_wait_s,
)
from switchyard.policy.keys import Principal
from switchyard.policy.models import EffectiveFlow, ModelEntry, RiskTier
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)
T = TypeVar("T")

H_COST = "x-switchyard-cost-usd"


def input_tokens_bound(family: str, texts: Sequence[str]) -> int:
    """At least the tokens a provider bills for embedding `texts` (an embedding bills each
    input's own tokens, with no chat framing):

    - where `tokens.count_input_tokens` is exact (`EXACT_FAMILIES`, i.e. OpenAI's BPEs, and our
      byte model), that count of each text as one user message: exact, plus the framing chat
      bills (a few tokens per input over);
    - elsewhere (`generic`, e.g. Titan; `claude`) its UTF-8 bytes plus `OUTPUT_SPECIAL_TOKENS`:
      a byte-level BPE has at least one byte per token, and a SentencePiece-like vocabulary
      with byte fallback at most one token per byte plus a boundary marker (the argument of
      `tokens.output_tokens_upper_bound`). Not `count_input_tokens` there: its bytes-per-token
      ratio is an average, and the input is all an embedding costs, so a low count would let
      a request spend money the ledger did not hold. English is held at ~4x its cost; the
      rest is returned when the request settles."""
    if family in EXACT_FAMILIES or family == "bytes":
        return sum(count_input_tokens(family, [{"role": "user", "content": text}]) for text in texts)
    return sum(len(text.encode()) + OUTPUT_SPECIAL_TOKENS for text in texts)


def budget_refusal(exc: OverBudget | RateLimited | BudgetUnavailable | TimeoutError) -> tuple[GatewayError, str]:
    """The client's error for a reservation the budget gate refused, and the audit record's
    budget decision: 402 over budget, 429 rate limited, 503 when the ledger is out of reach
    (or slower than the deadline) — nothing is charged in any of them."""
    if isinstance(exc, OverBudget):
        return PaymentRequired("over_budget", str(exc)), f"over_budget:{exc.budget}"
    if isinstance(exc, RateLimited):
        retry = str(max(1, math.ceil(exc.retry_after_s)))
        return TooManyRequests("rate_limited", str(exc), headers={"retry-after": retry}), f"rate_limited:{exc.limit}"
    down = Unavailable(
        "budget_unavailable",
        "the budget ledger cannot be reached right now; nothing was charged",
        headers={"retry-after": "1"},
    )
    return down, "ledger_unavailable"


@dataclass(frozen=True)
class EmbeddingPlan:
    """Everything decided before any I/O."""

    ctx: RequestContext
    policy_set: PolicySet
    request: EmbeddingRequest
    candidate: Candidate  # the model: the only one ever tried
    messages: list[dict[str, str]]  # the inputs as messages, before redaction (what is audited)


@dataclass
class _Run:
    """How far one request got: what was sent and tried, for its bills and its record."""

    plan: EmbeddingPlan
    log: ChainLog = field(default_factory=ChainLog)
    redaction: RedactionSummary = field(default_factory=lambda: RedactionSummary("none"))
    sent: tuple[str, ...] = ()  # the inputs as sent to the provider (redacted)


class _Refused(Exception):
    """A request refused before the provider call: its error and what the record says."""

    def __init__(self, error: GatewayError, outcome: Outcome) -> None:
        super().__init__(error.message)
        self.error = error
        self.outcome = outcome


class EmbeddingsPipeline:
    def __init__(self, parts: GatewayParts, embedders: EmbedderPool | None = None) -> None:
        """`embedders`: by default, clients built from the catalog, with the chat pool's
        in-cluster clients for kinds `serve` and `local` (one Serve handle per deployment)."""
        self.parts = parts
        self.flows = FlowCache()
        self.redaction = RedactionPool(parts.redaction_workers)
        if embedders is None:
            embedders = EmbedderPool(in_cluster=lambda name, spec: parts.providers.get(name))
        self.embedders = embedders
        self.caller = EmbeddingCaller(parts, embedders)
        self._owned = OwnedTasks()  # settle-and-audit work a client's hang-up cannot cut short
        self._sync(parts.policies())  # build the clients now, not on a request's time

    def _sync(self, ps: PolicySet) -> None:
        self.parts.providers.sync(ps)  # first: the in-cluster embedders are its clients
        self.embedders.sync(ps)

    # ------------------------------------------------------------ entry point

    async def handle(self, raw: bytes, headers: Mapping[str, str], principal: Principal | None = None) -> JSONResult:
        """`principal`: the caller, when the HTTP layer authenticated before reading `raw`."""
        request_id = uuid.uuid4().hex
        now, started = self.parts.clock(), self.parts.timer()
        hdr = {
            H_REQUEST_ID: request_id,
            H_SDK_REQUEST_ID: request_id,  # what OpenAI's SDKs read as `_request_id`, as chat answers do
            H_PROVIDER: "none",
            H_MODEL: "none",
            H_PROMPT: "none",  # no prompt is rendered for embeddings
            H_FALLBACK: "none",  # and there is never a fallback (see the module docstring)
            H_COST: f"{0:.8f}",
        }
        ps = self.parts.policies()
        self._sync(ps)
        try:
            plan = self._plan(ps, raw, headers, request_id, now, started, principal)
        except GatewayError as exc:
            # Not audited, as for chat: refused while planning, before any work was done.
            self.parts.metrics.request("unknown", "unknown", exc.status, None)
            return error_result(exc, hdr)
        return await self._execute(_Run(plan), hdr)

    def _plan(
        self,
        ps: PolicySet,
        raw: bytes,
        headers: Mapping[str, str],
        request_id: str,
        now: float,
        started: float,
        principal: Principal | None,
    ) -> EmbeddingPlan:
        principal = principal or self.parts.keys.authenticate(headers)
        if headers.get(IDEMPOTENCY_HEADER) is not None:
            raise BadRequest(
                "idempotency_unsupported",
                "Idempotency-Key is not supported on embeddings requests yet; send the request without it "
                "(a retry is run, and charged, again)",
                param="Idempotency-Key",
            )
        request, texts = parse_embedding_request(raw)
        flow = self.flows.for_request(ps, principal.team, headers)
        model = pick_primary(ps, flow, request.model)
        entry = ps.providers.models[model]
        check_embedding_model(flow, model, entry, request)
        # Chat's provider, compliance and capability rules for the model; the flow's fallbacks
        # play no part.
        no_fallbacks = flow.model_copy(update={"fallback": ()})
        route = plan_route(ps, no_fallbacks, model, _no_fallback_judge, Needs(embedding=True))
        limit = ps.data.classes[flow.data_class].max_text_chars
        total = sum(len(t) for t in texts)
        if total > limit:
            raise BadRequest(
                "text_too_long",
                f"input: {total} characters of text exceed the {limit} allowed for data class {flow.data_class!r}",
                param="input",
            )
        ctx = RequestContext(
            request_id=request_id,
            received_at=now,
            started=started,
            team=principal.team,
            key_id=principal.key_id,
            user=request.user,
            flow=flow,
            requested_model=request.model,
            prompt_ref="none",
            idempotency_key=None,
            deadline=started + deadline_ms(flow, headers) / 1000,
            stream=False,
        )
        messages = [{"role": "user", "content": t} for t in texts]
        return EmbeddingPlan(ctx, ps, request, route.candidates[0], messages)

    # ------------------------------------------------------------ one request

    async def _execute(self, run: _Run, hdr: dict[str, str]) -> JSONResult:
        """Admission first: a shed request costs nothing, and is counted and audited."""
        ctx, parts = run.plan.ctx, self.parts
        settings = run.plan.policy_set.org.gateway.admission
        ticket = parts.admission.admit(settings, ctx.team, ctx.flow.priority, run.plan.candidate.provider)
        if isinstance(ticket, Shed):
            parts.metrics.shed(ctx.team, ctx.flow.flow, ticket.priority.value, ticket.reason)
            err = Unavailable("overloaded", ticket.message(), headers={"retry-after": str(ticket.retry_after_s)})
            return await self._fail(run, Outcome(status=503, error_code="overloaded"), err, hdr)
        try:
            return await self._admitted(run, hdr)
        finally:
            ticket.release()

    async def _admitted(self, run: _Run, hdr: dict[str, str]) -> JSONResult:
        plan, parts = run.plan, self.parts
        ctx, flow = plan.ctx, plan.ctx.flow
        try:
            remaining_s = ctx.deadline - parts.timer()
            redacted = await self.redaction.redact(parts.redactor, plan.messages, flow.data_class, remaining_s)
        except DeadlineExceeded as exc:
            return await self._fail(run, Outcome(status=504, error_code=exc.code), exc, hdr)
        except Exception:  # fail closed: nothing leaves unredacted when the redactor breaks
            log.exception("redaction failed for request %s (data class %s)", ctx.request_id, flow.data_class)
            self._count(ctx, 503, None)
            return error_result(
                Unavailable("redaction_unavailable", f"data class {flow.data_class!r} cannot be redacted right now"),
                hdr,
            )
        run.redaction = redacted.summary
        run.sent = tuple(m["content"] for m in redacted.messages)
        try:
            reservation = await self._reserve(run)
        except _Refused as refused:
            return await self._fail(run, refused.outcome, refused.error, hdr)
        try:
            answer = await self.caller.call(
                plan.ctx, plan.policy_set, plan.candidate, run.sent, plan.request.dimensions, run.log
            )
        except ProviderError as exc:
            err = self.caller.failure(plan.ctx, plan.policy_set, plan.candidate, exc, run.log)
            outcome = Outcome(status=err.status, budget_decision="reserved", error_code=err.code)
            return await self._fail(run, outcome, err, hdr, reservation)
        except BaseException as exc:
            # Cancelled (the client hung up) or a bug: the call under way is charged at the bound,
            # the request audited, in a task the request's cancellation cannot reach.
            gone = cut_short(exc)
            await asyncio.shield(self._own(self._charge_and_record(run, reservation, gone)))
            if not isinstance(exc, Exception):
                raise
            # A bug: answered as the gateway's 500 with the request's id (the app's handler has none).
            log.error("embeddings request %s failed in the gateway", plan.ctx.request_id, exc_info=exc)
            return error_result(internal_error(), hdr)
        return await self._answer(run, reservation, answer, hdr)

    async def _reserve(self, run: _Run) -> Reservation:
        plan, parts = run.plan, self.parts
        ctx = plan.ctx
        try:
            estimate = cost_bound(plan.candidate, run.sent, ctx.day)
        except UnknownPrice as exc:
            log.error("request %s: %s", ctx.request_id, exc)
            unpriced = Unavailable(
                "price_unknown", "this flow's embedding model has no price today; nothing was charged"
            )
            raise _Refused(
                unpriced, Outcome(status=503, budget_decision="no_price", error_code="price_unknown")
            ) from None
        try:
            # Bounded by the deadline: a ledger that cannot answer in time is an outage (503),
            # and no provider is called with money the ledger did not grant.
            async with asyncio.timeout(max(ctx.deadline - parts.timer(), 0.0)):
                return await parts.budget.reserve(ctx, estimate)
        except (OverBudget, RateLimited, BudgetUnavailable, TimeoutError) as exc:
            if isinstance(exc, BudgetUnavailable | TimeoutError):
                log.error("request %s: the budget ledger is unavailable: %s", ctx.request_id, exc or "deadline passed")
            err, decision = budget_refusal(exc)
            raise _Refused(err, Outcome(status=err.status, budget_decision=decision, error_code=err.code)) from None

    async def _answer(self, run: _Run, reservation: Reservation, answer: Embeddings, hdr: dict[str, str]) -> JSONResult:
        plan, parts = run.plan, self.parts
        ctx, cand = plan.ctx, plan.candidate
        tokens = answer.prompt_tokens if answer.usage_reported else input_tokens_bound(cand.entry.family, run.sent)
        outcome = Outcome(
            status=200,
            budget_decision="reserved",
            provider=cand.provider,
            model_version=answer.model_version or cand.entry.model_version,
            usage=Usage(tokens, 0),
        )
        hdr.update({H_PROVIDER: cand.provider, H_MODEL: outcome.model_version or "none"})
        # Charged and audited in a task the pipeline owns: a client that hangs up now cannot
        # cut the charge or the record short (the answer just is not sent).
        unrecorded = await asyncio.shield(self._own(self._charge_and_audit(run, reservation, outcome)))
        if unrecorded is not None:
            self._count(ctx, 503, cand.provider)
            hdr[H_COST] = f"{outcome.cost:.8f}"
            down = Unavailable(
                AUDIT_UNAVAILABLE, f"the audit store cannot take the record of this high-risk request ({unrecorded})"
            )
            return error_result(down, hdr)
        hdr[H_COST] = f"{outcome.cost:.8f}"
        warnings = parts.budget.warnings(reservation)
        if warnings:
            hdr[H_BUDGET_WARNING] = "; ".join(warnings)
        self._count(ctx, 200, cand.provider)
        total_ms = (parts.timer() - ctx.started) * 1000
        upstream_ms = sum(a.latency_ms for a in run.log.attempts)
        parts.metrics.stage_latency("total", total_ms)
        parts.metrics.stage_latency("gateway_overhead", total_ms - upstream_ms)
        hdr["server-timing"] = f"gateway;dur={total_ms - upstream_ms:.3f}, upstream;dur={upstream_ms:.3f}"
        body = embeddings_body(cand.model, answer.vectors, tokens, plan.request.encoding_format)
        return JSONResult(200, body, hdr)

    # ------------------------------------------------------------ charges and records

    async def _fail(
        self,
        run: _Run,
        outcome: Outcome,
        err: GatewayError,
        hdr: dict[str, str],
        reservation: Reservation | None = None,
    ) -> JSONResult:
        """Answer `err`; first charge what was billed (if anything was reserved) and audit the
        refusal, in a task the pipeline owns, so a client that hangs up cannot cut it short."""
        await asyncio.shield(self._own(self._charge_and_record(run, reservation, outcome)))
        hdr[H_COST] = f"{outcome.cost:.8f}"
        return error_result(err, hdr)

    async def _charge_and_record(self, run: _Run, reservation: Reservation | None, o: Outcome) -> None:
        cand = run.log.current
        if cand is not None:  # cut off mid-call: the provider may bill its answer all the same
            o.provider, o.model_version = cand.provider, cand.entry.model_version
        if reservation is not None:
            o.cost = await self._charge(run, reservation, o)
        self._count(run.plan.ctx, o.status, o.provider)
        try:
            await self._audit(run, o)
        except AuditUnavailable as exc:  # no answer is left to withhold: logged
            log.error("audit record of failed request %s was not written: %s", run.plan.ctx.request_id, exc)

    async def _charge_and_audit(self, run: _Run, reservation: Reservation, o: Outcome) -> AuditUnavailable | None:
        """An answer's charge and record. An `AuditUnavailable` returned means the answer must
        not be sent: its record, kept for the store's return, says it was withheld."""
        o.cost = await self._charge(run, reservation, o)
        try:
            await self._audit(run, o, withholds=True)
        except AuditUnavailable as exc:
            return exc  # returned, not raised: the owned task has not failed
        return None

    async def _charge(self, run: _Run, reservation: Reservation, o: Outcome) -> float:
        """Settle what the provider billed, or free the reservation if nothing was billed; the
        bills go to the metrics and the audit record alike."""
        bills = self._bills(run)
        o.bills = tuple(bills)
        if not bills:
            await self.parts.budget.release(reservation)
            return 0.0
        await self.parts.budget.settle(reservation, bills)
        ctx = run.plan.ctx
        for b in bills:
            self.parts.metrics.usage(ctx.team, ctx.flow.flow, b.model, b.usage.prompt_tokens, 0, nanos_to_usd(b.nanos))
        return total_usd(bills)

    def _bills(self, run: _Run) -> list[Bill]:
        """One bill per attempt the provider billed: at the tokens it reported, else (no usage,
        an unreadable answer, a timeout, a call cut off by the client) at the bound."""
        catalog, day, cand = run.plan.policy_set.providers, run.plan.ctx.day, run.plan.candidate
        bound = Usage(input_tokens_bound(cand.entry.family, run.sent), 0)
        bills = [
            bill(catalog, a.model, a.usage, day, "reported")
            if a.usage is not None
            else bill(catalog, a.model, bound, day, "bound")
            for a in run.log.attempts
            if a.usage is not None or a.billed_unknown
        ]
        if run.log.current is not None:
            bills.append(bill(catalog, run.log.current.model, bound, day, "bound"))
        return bills

    async def _audit(self, run: _Run, o: Outcome, *, withholds: bool = False) -> None:
        """The request's record; it waits for the store until the deadline (`record_wait_s`),
        as the chat pipeline's does."""
        ctx = run.plan.ctx
        exchange = Exchange(
            ctx=ctx,
            status_code=o.status,
            input_messages=run.plan.messages,
            output_text=None,  # vectors are not stored (see the module docstring)
            attempts=tuple(run.log.attempts),
            provider=o.provider,
            model_version=o.model_version,
            usage=o.usage,
            cost_usd=o.cost,
            bills=o.bills,
            latency_ms=(self.parts.timer() - ctx.started) * 1000,
            budget_decision=o.budget_decision,
            redaction=run.redaction,
            contract_result="not_declared" if run.log.attempts else "not_reached",
            error_code=o.error_code,
        )
        within_s = record_wait_s(ctx, self.parts.timer())
        await self.parts.audit.record(
            exchange, durable=ctx.flow.risk_tier is RiskTier.HIGH, within_s=within_s, withholds=withholds
        )

    def _count(self, ctx: RequestContext, status: int, provider: str | None) -> None:
        """One request's fate in the metrics: its status and its end-to-end time."""
        self.parts.metrics.request(ctx.team, ctx.flow.flow, status, provider)
        self.parts.metrics.latency(ctx.team, ctx.flow.flow, provider, status, self.parts.timer() - ctx.started)

    def _own(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return self._owned.run(work)

    async def drain(self) -> None:
        """Wait for settle-and-audit work still running (call at shutdown, before the budget
        gate and audit sink close)."""
        await self._owned.drain()

    async def aclose(self) -> None:
        """`drain`, then close the embedding clients this pipeline built."""
        await self.drain()
        self.redaction.close()
        await self.embedders.aclose()


def check_embedding_model(flow: EffectiveFlow, model: str, entry: ModelEntry, request: EmbeddingRequest) -> None:
    """The model must embed (a chat model named here is the client's mistake: 400 naming
    `model`), and `dimensions`, if asked, must be a size it can make."""
    if entry.task != "embedding":
        raise BadRequest(
            "not_an_embedding_model",
            f"model: {model!r} is a {entry.task} model; /v1/embeddings needs an embedding model of flow "
            f"{flow.team}/{flow.flow} (by name, or `auto` on a flow whose model embeds)",
            param="model",
        )
    top = entry.embedding_dimensions
    if request.dimensions is not None and top is not None and request.dimensions > top:
        raise BadRequest(
            "dimensions_unsupported",
            f"dimensions: model {model!r} makes vectors of at most {top} dimensions",
            param="dimensions",
        )


def cost_bound(cand: Candidate, texts: Sequence[str], day: date) -> CostEstimate:
    """The hold: the bound of the input tokens at the model's input price. Raises `UnknownPrice`."""
    tokens = input_tokens_bound(cand.entry.family, texts)
    nanos = entry_price(cand.model, cand.entry, day).estimate_nanos(tokens, 0)
    return CostEstimate(cand.model, tokens, 0, nanos_to_usd(nanos), nanos)


def _no_fallback_judge(flow: EffectiveFlow, model: str, entry: ModelEntry) -> EvalVerdict:
    raise AssertionError("an embeddings route has no fallbacks to judge")
