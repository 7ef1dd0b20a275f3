"""The request pipeline, in the order of DESIGN.md's request path:

authenticate -> resolve flow -> render prompt -> admission control (shed when saturated) ->
redact -> reserve budget and rate limit ->
route (primary, fallbacks, circuits, retries, idempotency, deadline) -> validate the output
contract -> settle -> audit -> respond with headers saying who answered and why.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
import time
import uuid
import weakref
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

from switchyard.budgets.money import nanos_to_usd, usd_to_nanos
from switchyard.budgets.pricing import UnknownPrice, estimate_call
from switchyard.budgets.tokens import EXACT_FAMILIES, openai_encoding
from switchyard.gateway.admission_control import AdmissionController, Shed
from switchyard.gateway.attempts import (
    AttemptRunner,
    ChainFailed,
    ChainLog,
    ChainRequest,
    RetryPolicy,
    close_stream_soon,
)
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.billing import bill, billed_attempts, chain_bound, total_usd
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.contracts import OutputContracts
from switchyard.gateway.errors import (
    DeadlineExceeded,
    GatewayError,
    PaymentRequired,
    TooManyRequests,
    Unavailable,
    internal_error,
)
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.failures import chain_error
from switchyard.gateway.idempotency import (
    IdempotencyStore,
)
from switchyard.gateway.image_fetch import ImageFetcher
from switchyard.gateway.keyed_requests import KeyedRequests
from switchyard.gateway.messages import Message
from switchyard.gateway.metrics import GatewayMetrics
from switchyard.gateway.outcome import Outcome, cut_short
from switchyard.gateway.owned_tasks import OwnedTasks
from switchyard.gateway.planning import Plan, Planner
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import ProviderCall, ProviderOverloaded
from switchyard.gateway.redaction_pool import RedactionPool
from switchyard.gateway.results import (
    H_BUDGET_LEFT,
    H_BUDGET_WARNING,
    H_COST,
    H_FALLBACK,
    H_MODEL,
    H_PROMPT,
    H_PROVIDER,
    H_REQUEST_ID,
    H_SDK_REQUEST_ID,
    JSONResult,
    Result,
    StreamResult,
    budget_left,
    cost_header,
    error_result,
    rate_limit_headers,
    release_after,
    replay_stream,
)
from switchyard.gateway.routing import Candidate
from switchyard.gateway.seams import (
    AUDIT_UNAVAILABLE,
    AuditSink,
    AuditUnavailable,
    Bill,
    BudgetGate,
    BudgetUnavailable,
    Exchange,
    Headroom,
    OverBudget,
    RateLimited,
    Redacted,
    RedactionSummary,
    Redactor,
    Reservation,
    Usage,
    record_wait_s,
)
from switchyard.gateway.stage_timing import StageTimings
from switchyard.gateway.streaming import StreamSettlement, stream_body
from switchyard.gateway.tracing import GatewayTracing, Stage
from switchyard.gateway.wire import completion_body, tool_call_body
from switchyard.policy.keys import Principal
from switchyard.policy.models import RiskTier
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class GatewayParts:
    """Everything the pipeline calls; chosen when the gateway is built (in-process or Serve)."""

    policies: Callable[[], PolicySet]
    keys: KeySnapshot
    providers: ProviderPool
    budget: BudgetGate
    redactor: Redactor
    audit: AuditSink
    metrics: GatewayMetrics
    idempotency: IdempotencyStore
    circuits: CircuitBoard = field(default_factory=CircuitBoard)
    admission: AdmissionController = field(default_factory=AdmissionController)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    clock: Callable[[], float] = time.time  # timestamps: records, budget days
    timer: Callable[[], float] = time.monotonic  # durations and deadlines (see `RequestContext`)
    idempotency_poll_s: float = 0.02
    # The eval records behind high-risk fallbacks; pass one with the state dir's signing key
    # (`EvalBook(EvalSigner.in_state_dir(state))`): the default trusts no record.
    evals: EvalBook = field(default_factory=EvalBook)
    redaction_workers: int = 1  # threads for large messages (see `RedactionPool`)
    # (team, user) -> the end user's audit pseudonym, which names stored idempotent answers
    pseudonym: Callable[[str, str], str] | None = None
    tracing: GatewayTracing = field(default_factory=GatewayTracing)  # default: no-op
    stage_timing: bool = False  # `server-timing` per stage, for benchmark runs (`stage_timing`)


class ChatPipeline:
    def __init__(self, parts: GatewayParts) -> None:
        self.parts = parts
        self.planner = Planner(parts.keys, parts.evals)
        self.contracts = OutputContracts()
        self.redaction = RedactionPool(parts.redaction_workers)
        self._images: ImageFetcher | None = None  # made when a flow first fetches an image
        self._owned = OwnedTasks()  # settle-and-audit work a client's hang-up cannot cut short
        self.keyed = KeyedRequests(self.own, parts.timer, parts.idempotency_poll_s, parts.pseudonym)
        self.runner = AttemptRunner(
            parts.providers.get,
            parts.circuits,
            parts.metrics,
            self.contracts,
            parts.retry,
            parts.clock,
            parts.timer,
            tracing=parts.tracing,
        )
        # Build the clients and load the exact tokenizers now: a boto3 client takes ~100 ms, the
        # o200k ranks ~200 ms; neither is for a request to pay.
        parts.providers.sync(parts.policies())
        for family in {m.family for m in parts.policies().providers.models.values()} & EXACT_FAMILIES:
            openai_encoding(family)

    # ------------------------------------------------------------ entry point

    @contextmanager
    def _stage(self, plan: Plan, name: Stage) -> Iterator[None]:
        """A stage of the request: a span when tracing, a `server-timing` entry when timing."""
        with self.parts.tracing.stage(name, plan.span):
            if plan.timings is None:
                yield
            else:
                with plan.timings.stage(name):
                    yield

    async def handle(self, raw: bytes, headers: Mapping[str, str], principal: Principal | None = None) -> Result:
        """`principal`: the caller, when the HTTP layer authenticated before reading `raw`."""
        request_id = uuid.uuid4().hex
        now, started = self.parts.clock(), self.parts.timer()
        hdr = {
            H_REQUEST_ID: request_id,
            H_SDK_REQUEST_ID: request_id,
            H_PROVIDER: "none",
            H_MODEL: "none",
            H_PROMPT: "none",
            H_FALLBACK: "none",
        }
        ps = self.parts.policies()
        self.parts.providers.sync(ps)
        timings = StageTimings() if self.parts.stage_timing else None
        try:
            with timings.stage("plan") if timings is not None else nullcontext():
                plan = self.planner.plan(ps, raw, headers, request_id, now, started, principal)
        except GatewayError as exc:
            # Not audited: before a flow is resolved there is no flow policy to audit under.
            self.parts.metrics.request("unknown", "unknown", exc.status, None)
            self.parts.metrics.latency("unknown", "unknown", None, exc.status, self.parts.timer() - started)
            return error_result(exc, hdr)
        hdr[H_PROMPT] = plan.ctx.prompt_ref
        if timings is not None:
            plan = replace(plan, timings=timings)
        ctx = plan.ctx
        # Ended by `_count`, once the request's fate is known (a stream's after its last byte).
        tracing = self.parts.tracing
        if tracing.enabled:  # untraced, the plan carries no span and every stage is free
            span = tracing.start_request(
                "chat",
                ctx.requested_model,
                team=ctx.team,
                flow=ctx.flow.flow,
                request_id=ctx.request_id,
                max_tokens=plan.max_tokens,
            )
            plan = replace(plan, span=span)
        if plan.ctx.idempotency_key is not None:
            return await self.keyed.run(
                self.parts.idempotency,
                plan.ctx,
                raw,
                hdr,
                lambda: self._execute(plan, hdr),
                lambda result: self._answered_here(plan, result),
            )
        return await self._execute(plan, hdr)

    # ------------------------------------------------------------ idempotency

    def _answered_here(self, plan: Plan, result: JSONResult) -> JSONResult:
        """A request the idempotency store answered (a replay, a conflict, a refusal) without
        running: counted and traced like every other (not audited: nothing was run or charged;
        the replayed answer's own record is its audit)."""
        self._count(plan, result.status, result.headers.get(H_PROVIDER) if result.status == 200 else None)
        return result

    # ------------------------------------------------------------ admission control

    async def _execute(self, plan: Plan, hdr: dict[str, str]) -> Result:
        """Admission first: a shed request costs nothing (no redaction, no budget, no upstream
        call); like other refusals after the flow is known, it is counted and audited."""
        ctx = plan.ctx
        settings = plan.policy_set.org.gateway.admission
        ticket = self.parts.admission.admit(settings, ctx.team, ctx.flow.priority, plan.route.candidates[0].provider)
        if isinstance(ticket, Shed):
            self.parts.metrics.shed(ctx.team, ctx.flow.flow, ticket.priority.value, ticket.reason)
            err = Unavailable("overloaded", ticket.message(), headers={"retry-after": str(ticket.retry_after_s)})
            nothing_sent = Redacted([], RedactionSummary("none"))
            return await self._fail(
                plan, nothing_sent, Outcome(status=503, error_code="overloaded"), err, hdr, ChainLog()
            )
        try:
            result = await self._admitted(plan, hdr)
        except BaseException:
            ticket.release()
            raise
        if isinstance(result, StreamResult):
            return StreamResult(result.headers, release_after(result.body, ticket), result.status)
        ticket.release()
        return result

    async def _fetch_images(self, plan: Plan) -> list[Message]:
        """The messages as they leave: https images inlined as bytes where the flow fetches them
        (the audit record keeps the URLs as the client sent them)."""
        rules = plan.ctx.flow.image_fetch
        if rules is None or not plan.needs.images:
            return plan.messages
        if self._images is None:
            self._images = ImageFetcher()
        return await self._images.inline(plan.messages, rules, plan.ctx.deadline - self.parts.timer())

    def _chain_error(self, plan: Plan, failed: ChainFailed, chain: ChainLog) -> GatewayError:
        err = chain_error(plan, failed, chain)
        cause = failed.error
        if isinstance(cause, ProviderOverloaded) and err.code == "overloaded":
            ctx = plan.ctx
            provider = chain.attempts[-1].provider if chain.attempts else plan.route.candidates[0].provider
            shed = self.parts.admission.backpressure(
                plan.policy_set.org.gateway.admission, provider, ctx.flow.priority, cause.queued, cause.max_queued
            )
            err.headers["retry-after"] = str(max(shed.retry_after_s, math.ceil(cause.retry_after_s or 0)))
            self.parts.metrics.shed(ctx.team, ctx.flow.flow, shed.priority.value, shed.reason)
        return err

    # ------------------------------------------------------------ one request

    async def _admitted(self, plan: Plan, hdr: dict[str, str]) -> Result:
        ctx, flow, parts = plan.ctx, plan.ctx.flow, self.parts
        try:
            outgoing = await self._fetch_images(plan)
        except GatewayError as exc:  # the client's image could not be fetched: nothing was sent
            nothing_sent = Redacted([], RedactionSummary("none"))
            outcome = Outcome(status=exc.status, error_code=exc.code)
            return await self._fail(plan, nothing_sent, outcome, exc, hdr, ChainLog())
        try:
            remaining_s = ctx.deadline - parts.timer()
            with self._stage(plan, "redaction"):
                redacted = await self.redaction.redact(parts.redactor, outgoing, flow.data_class, remaining_s)
        except DeadlineExceeded as exc:
            nothing_sent = Redacted([], RedactionSummary("none"))
            outcome = Outcome(status=504, error_code=exc.code)
            return await self._fail(plan, nothing_sent, outcome, exc, hdr, ChainLog())
        except Exception:  # fail closed: nothing leaves unredacted when the redactor breaks
            log.exception("redaction failed for request %s (data class %s)", ctx.request_id, flow.data_class)
            self._count(plan, 503, None)
            return error_result(
                Unavailable("redaction_unavailable", f"data class {flow.data_class!r} cannot be redacted right now"),
                hdr,
            )
        for skip in plan.route.skipped:
            parts.metrics.candidate_skipped(plan.policy_set.providers.models[skip.model].provider, skip.reason)
        chain = ChainLog(hops=[f"{s.model}:{s.reason}" for s in plan.route.skipped if s.capability])
        primary = plan.route.candidates[0]
        outcome = Outcome(status=200)
        catalog = plan.policy_set.providers
        try:
            # Held before the first call: everything the chain may bill, fallbacks and repairs
            # at their own models' prices (docs/budgets.md, "What a request holds").
            estimate = chain_bound(
                catalog,
                plan.route.candidates,
                redacted.messages,
                plan.max_tokens,
                plan.output is not None,  # a request's response_format may be repaired too
                ctx.day,
                plan.tools,
            )
        except UnknownPrice as exc:
            log.error("request %s: %s", ctx.request_id, exc)
            outcome = Outcome(status=503, budget_decision="no_price", error_code="price_unknown")
            unpriced = Unavailable("price_unknown", "a model of this flow has no price today; nothing was charged")
            return await self._fail(plan, redacted, outcome, unpriced, hdr, chain)
        try:
            # Bounded by the deadline: a ledger that cannot answer in time is an outage (503),
            # and no provider is called with money the ledger did not grant.
            with self._stage(plan, "budget.reserve"):
                async with asyncio.timeout(max(ctx.deadline - parts.timer(), 0.0)):
                    reservation = await parts.budget.reserve(ctx, estimate)
        except OverBudget as exc:
            outcome = Outcome(status=402, budget_decision=f"over_budget:{exc.budget}", error_code="over_budget")
            return await self._fail(plan, redacted, outcome, PaymentRequired("over_budget", str(exc)), hdr, chain)
        except RateLimited as exc:
            outcome = Outcome(status=429, budget_decision=f"rate_limited:{exc.limit}", error_code="rate_limited")
            limited = TooManyRequests(
                "rate_limited", str(exc), headers={"retry-after": str(max(1, math.ceil(exc.retry_after_s)))}
            )
            return await self._fail(plan, redacted, outcome, limited, hdr, chain)
        except (BudgetUnavailable, TimeoutError) as exc:
            log.error("request %s: the budget ledger is unavailable: %s", ctx.request_id, exc or "deadline passed")
            outcome = Outcome(status=503, budget_decision="ledger_unavailable", error_code="budget_unavailable")
            down = Unavailable(
                "budget_unavailable",
                "the budget ledger cannot be reached right now; nothing was charged",
                headers={"retry-after": "1"},
            )
            return await self._fail(plan, redacted, outcome, down, hdr, chain)
        outcome.budget_decision = "reserved"
        room = parts.budget.headroom(reservation)
        hdr.update(rate_limit_headers(room))
        base = ProviderCall(
            model=primary.model,
            model_version=primary.entry.model_version,
            messages=[],
            max_tokens=plan.max_tokens,
            timeout_s=0.0,
            request_id=ctx.request_id,
            temperature=plan.request.temperature,
            top_p=plan.request.top_p,
            stop=plan.request.stop_sequences(),
            tools=plan.tools,
            tool_choice=plan.request.tool_choice_value(),
            parallel_tool_calls=plan.request.parallel_tool_calls,
        )
        run = ChainRequest(
            ps=plan.policy_set,
            ctx=ctx,
            candidates=plan.route.candidates,
            messages=redacted.messages,
            max_tokens=plan.max_tokens,
            base=base,
            log=chain,
            output=plan.output,
            span=plan.span,
        )
        if ctx.stream and plan.output is None:
            return await self._start_stream(plan, redacted, reservation, run, hdr, room)

        def restore(text: str) -> str:
            restorer = parts.redactor.restorer(redacted)
            return restorer.feed(text) + restorer.flush()

        try:
            answer = await self.runner.complete(run, restore)
        except ChainFailed as failed:
            err = self._chain_error(plan, failed, chain)
            outcome = Outcome(
                status=err.status,
                budget_decision="reserved",
                contract="invalid" if failed.contract_problem else "not_reached",
                error_code=err.code,
            )
            # Answers that broke the contract were billed: charged, though the chain failed.
            return await self._fail(plan, redacted, outcome, err, hdr, chain, reservation)
        except BaseException as exc:
            # Cancelled (the client left) or a bug: what was billed is charged, the rest freed,
            # and the request audited, in a task the cancellation cannot reach.
            gone = cut_short(exc)
            await asyncio.shield(self.own(self._charge_and_audit(plan, redacted, reservation, gone, chain)))
            if not isinstance(exc, Exception):
                raise
            return self._bug_answer(plan, exc, hdr)
        done, cand = answer.value, answer.candidate
        text = restore(done.text)
        calls = tuple(replace(c, arguments=restore(c.arguments)) for c in done.tool_calls)
        hdr.update(
            {
                H_PROVIDER: cand.provider,
                H_MODEL: done.model_version or cand.entry.model_version,
                H_FALLBACK: chain.header(),
            }
        )
        outcome = Outcome(
            status=200,
            budget_decision="reserved",
            contract="valid" if plan.output is not None and not calls else "not_declared",
            output_text=text,
            tool_calls=calls,
            provider=cand.provider,
            model_version=hdr[H_MODEL],
            usage=done.usage,
        )
        # Charged and audited in a task the pipeline owns: a client that hangs up now cannot
        # cut the charge or the record short (the answer just is not sent).
        unrecorded = await asyncio.shield(
            self.own(self._charge_and_audit_answer(plan, redacted, reservation, outcome, chain))
        )
        if unrecorded is not None:
            hdr[H_COST] = cost_header(outcome.cost)
            self._count(plan, 503, cand.provider, AUDIT_UNAVAILABLE)
            return error_result(
                Unavailable(
                    AUDIT_UNAVAILABLE,
                    f"the audit store cannot take the record of this high-risk request ({unrecorded})",
                ),
                hdr,
            )
        warnings = parts.budget.warnings(reservation)
        if warnings:  # the team's own code (and its admins' dashboards) see a budget running low
            hdr[H_BUDGET_WARNING] = "; ".join(warnings)
        hdr[H_COST] = cost_header(outcome.cost)
        left = budget_left(room, reservation, outcome.cost)
        if left is not None:
            hdr[H_BUDGET_LEFT] = f"{left:.8f}"
        self._count(plan, 200, cand.provider)
        total_ms = (parts.timer() - ctx.started) * 1000
        upstream_ms = sum(a.latency_ms for a in chain.attempts)
        parts.metrics.stage_latency("total", total_ms)
        parts.metrics.stage_latency("gateway_overhead", total_ms - upstream_ms)
        hdr["server-timing"] = f"gateway;dur={total_ms - upstream_ms:.3f}, upstream;dur={upstream_ms:.3f}"
        if plan.timings is not None:
            hdr["server-timing"] += ", " + plan.timings.header_entries()
        if ctx.stream:  # an answer with a contract: buffered, validated, then streamed
            return StreamResult(
                hdr,
                replay_stream(
                    ctx.request_id,
                    cand.model,
                    text,
                    done.finish_reason,
                    done.usage,
                    plan.request.stream_options is not None and plan.request.stream_options.include_usage,
                    calls,
                ),
            )
        body = completion_body(ctx.request_id, cand.model, text, done.finish_reason, done.usage, tool_calls=calls)
        return JSONResult(200, body, hdr)

    # ------------------------------------------------------------ streaming

    async def _start_stream(
        self,
        plan: Plan,
        redacted: Redacted,
        reservation: Reservation,
        run: ChainRequest,
        hdr: dict[str, str],
        room: Headroom,
    ) -> Result:
        chain = run.log
        try:
            answer = await self.runner.stream(run)
        except ChainFailed as failed:
            err = self._chain_error(plan, failed, chain)
            outcome = Outcome(status=err.status, budget_decision="reserved", error_code=err.code)
            return await self._fail(plan, redacted, outcome, err, hdr, chain, reservation)
        except BaseException as exc:
            # Cancelled (the client hung up) before the first token, or a bug: what the
            # provider may have billed is settled and the request audited, in a task the
            # request's cancellation cannot reach.
            gone = cut_short(exc)
            await asyncio.shield(
                StreamSettlement(self, plan, redacted, reservation, chain, chain.current, gone).finish()
            )
            if not isinstance(exc, Exception):
                raise
            return self._bug_answer(plan, exc, hdr)
        cand = answer.candidate
        hdr.update({H_PROVIDER: cand.provider, H_MODEL: cand.entry.model_version, H_FALLBACK: chain.header()})
        first, rest = answer.value
        outcome = Outcome(
            status=200,
            budget_decision="reserved",
            contract="not_declared",
            provider=cand.provider,
            model_version=cand.entry.model_version,
        )
        end = StreamSettlement(self, plan, redacted, reservation, chain, cand, outcome, room, answered=True)
        try:
            await self._open_stream_record(plan, redacted, reservation, chain, cand, outcome)
        except AuditUnavailable as exc:
            close_stream_soon(rest)
            outcome.status, outcome.error_code = 503, AUDIT_UNAVAILABLE
            await asyncio.shield(end.finish())  # what the provider may have billed, and the record
            return error_result(
                Unavailable(AUDIT_UNAVAILABLE, f"the audit log cannot keep this stream's record ({exc})"), hdr
            )
        end.stand_in = True
        body = stream_body(self.parts, plan, redacted, end, cand.model, first, rest)
        # A body the server never starts (the client left before it) never runs its `finally`.
        weakref.finalize(body, end.finish_soon, asyncio.get_running_loop())
        return StreamResult(hdr, body)

    # ------------------------------------------------------------ failures and records

    def _bug_answer(self, plan: Plan, exc: Exception, hdr: dict[str, str]) -> Result:
        """A bug, once its request was charged and audited: logged, and answered as the
        gateway's 500 with the request's id to quote (the app's own handler has none)."""
        log.error("request %s failed in the gateway", plan.ctx.request_id, exc_info=exc)
        return error_result(internal_error(), hdr)

    async def _fail(
        self,
        plan: Plan,
        redacted: Redacted,
        outcome: Outcome,
        err: GatewayError,
        hdr: dict[str, str],
        chain: ChainLog,
        reservation: Reservation | None = None,
    ) -> Result:
        """Answer `err`; first charge what was billed (if anything was reserved) and audit the
        refusal, in a task the pipeline owns, so a client that hangs up cannot cut it short."""
        hdr[H_FALLBACK] = chain.header()
        await asyncio.shield(self.own(self._charge_and_record(plan, redacted, reservation, outcome, chain)))
        if reservation is not None:
            hdr[H_COST] = cost_header(outcome.cost)
        return error_result(err, hdr)

    async def _charge_and_record(
        self, plan: Plan, redacted: Redacted, reservation: Reservation | None, o: Outcome, chain: ChainLog
    ) -> None:
        if reservation is not None:
            o.cost = await self.charge(plan, o, reservation, self.bills(plan, redacted, chain))
        await self.record_outcome(plan, redacted, o, chain, context="failed")

    async def _charge_and_audit_answer(
        self, plan: Plan, redacted: Redacted, reservation: Reservation, o: Outcome, chain: ChainLog
    ) -> AuditUnavailable | None:
        """An answer's charge and record. An `AuditUnavailable` returned means the answer must
        not be sent: its record, kept for the store's return, says it was withheld."""
        o.cost = await self.charge(plan, o, reservation, self.bills(plan, redacted, chain))
        try:
            await self._audit(plan, redacted, o, chain, withholds=True)
        except AuditUnavailable as exc:
            return exc  # returned, not raised: the owned task has not failed
        return None

    async def _open_stream_record(
        self,
        plan: Plan,
        redacted: Redacted,
        reservation: Reservation,
        chain: ChainLog,
        cand: Candidate,
        outcome: Outcome,
    ) -> None:
        """The stand-in record of a stream about to start (`outcome` as it stands): what it
        becomes if this replica dies before the stream settles. The budget journal then charges
        its whole reservation, so that is the cost it records."""
        lost = dataclasses.replace(
            outcome,
            status=502,
            cost=reservation.usd,
            bills=(Bill(cand.model, Usage(0, 0), usd_to_nanos(reservation.usd), "held"),),
            error_code="replica_lost",
        )
        with self._stage(plan, "audit.record"):  # the stand-in is an audit write
            await self.parts.audit.open_stream(
                self._exchange(plan, redacted, lost, chain), durable=plan.ctx.flow.risk_tier is RiskTier.HIGH
            )

    async def restate_stand_in(self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog) -> None:
        """A settled stream's stand-in, now with what it was charged; logged if it cannot be
        written (the record that follows is what counts)."""
        lost = dataclasses.replace(o, status=502, error_code="replica_lost")
        try:
            await self.parts.audit.open_stream(
                self._exchange(plan, redacted, lost, chain), durable=plan.ctx.flow.risk_tier is RiskTier.HIGH
            )
        except AuditUnavailable as exc:
            log.error("stand-in of stream %s not restated: %s", plan.ctx.request_id, exc)

    async def _audit(
        self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog, *, withholds: bool = False
    ) -> None:
        """The request's record. It waits for the store until the deadline (`record_wait_s`):
        an answer that `withholds` for want of it is then withheld; any other answer (an error,
        a stream whose bytes are out) ends, its record kept for the store's return."""
        within_s = record_wait_s(plan.ctx, self.parts.timer())
        with self._stage(plan, "audit.record"):
            await self.parts.audit.record(
                self._exchange(plan, redacted, o, chain),
                durable=plan.ctx.flow.risk_tier is RiskTier.HIGH,
                within_s=within_s,
                withholds=withholds,
            )

    def _exchange(self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog) -> Exchange:
        ctx = plan.ctx
        return Exchange(
            ctx=ctx,
            status_code=o.status,
            input_messages=plan.messages,
            output_text=o.output_text,
            output_tool_calls=tuple(tool_call_body(c) for c in o.tool_calls),
            attempts=tuple(chain.attempts),
            skipped=tuple((s.model, s.reason) for s in plan.route.skipped),
            provider=o.provider,
            model_version=o.model_version,
            usage=o.usage,
            cost_usd=o.cost,
            bills=o.bills,
            latency_ms=(self.parts.timer() - ctx.started) * 1000,
            budget_decision=o.budget_decision,
            redaction=redacted.summary,
            contract_result=o.contract if plan.output is not None or o.contract == "not_reached" else "not_declared",
            error_code=o.error_code,
        )

    def bills(self, plan: Plan, redacted: Redacted, chain: ChainLog) -> list[Bill]:
        """What the providers billed for this request's attempts so far."""
        return billed_attempts(
            plan.policy_set.providers, chain.attempts, plan.ctx.day, redacted.messages, plan.max_tokens, plan.tools
        )

    async def charge(self, plan: Plan, o: Outcome, reservation: Reservation, bills: list[Bill]) -> float:
        """Settle what the providers billed, or free the reservation if nothing was billed.
        Each bill is counted in the token and cost metrics and listed in the audit record, so
        the two always agree."""
        o.bills = tuple(bills)
        with self._stage(plan, "budget.settle"):
            if not bills:
                await self.parts.budget.release(reservation)
                return 0.0
            await self.parts.budget.settle(reservation, bills)
        ctx = plan.ctx
        for b in bills:
            usd = nanos_to_usd(b.nanos)
            self.parts.metrics.usage(
                ctx.team, ctx.flow.flow, b.model, b.usage.prompt_tokens, b.usage.completion_tokens, usd
            )
        return total_usd(bills)

    async def _charge_and_audit(
        self, plan: Plan, redacted: Redacted, reservation: Reservation, o: Outcome, chain: ChainLog
    ) -> None:
        bills = self.bills(plan, redacted, chain)
        cand = chain.current
        if cand is not None:  # cut off mid-call: the provider may bill its answer all the same
            catalog, day = plan.policy_set.providers, plan.ctx.day
            inputs = estimate_call(catalog, cand.model, redacted.messages, 0, day, plan.tools).input_tokens
            bills.append(bill(catalog, cand.model, Usage(inputs, plan.max_tokens), day, "bound"))
            o.provider, o.model_version = cand.provider, cand.entry.model_version
        o.cost = await self.charge(plan, o, reservation, bills)
        await self.record_outcome(plan, redacted, o, chain, context="cancelled")

    async def record_outcome(self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog, context: str) -> None:
        """Count and audit a request whose answer is already gone (or was never going to be
        sent): an audit failure is logged, since there is no response left to refuse."""
        try:
            await self._audit(plan, redacted, o, chain)
        except AuditUnavailable as exc:
            log.error("audit record of %s request %s was not written: %s", context, plan.ctx.request_id, exc)
        finally:
            self._count(plan, o.status, o.provider, o.error_code)  # after the audit: its span is inside

    def _count(self, plan: Plan, status: int, provider: str | None, error: str | None = None) -> None:
        """One request's fate in the metrics and its trace: its status and its end-to-end time.
        Called exactly once per request (the usage-invariant test counts it)."""
        ctx, metrics = plan.ctx, self.parts.metrics
        metrics.request(ctx.team, ctx.flow.flow, status, provider)
        metrics.latency(ctx.team, ctx.flow.flow, provider, status, self.parts.timer() - ctx.started)
        if plan.span is not None:
            plan.span.set_response(status, error)
            plan.span.end()

    def own(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        return self._owned.run(work)

    async def drain(self) -> None:
        """Wait for settle-and-audit work still running (call at shutdown, before the budget
        gate and audit sink close)."""
        await self._owned.drain()

    async def aclose(self) -> None:
        """Close what the pipeline owns (after `drain`)."""
        self.redaction.close()
        if self._images is not None:
            await self._images.aclose()

    def status(self) -> dict[str, Any]:
        snapshot = getattr(self.parts.metrics, "snapshot", None)
        return {
            "circuits": self.parts.circuits.snapshot(),
            "admission": self.parts.admission.snapshot(self.parts.policies().org.gateway.admission),
            "counters": snapshot() if callable(snapshot) else {},
        }
