"""A streamed answer after its first piece: the SSE body, and its settlement.

After the first byte there is no fallback. The body relays the provider's pieces (text and
tool calls, placeholders restored), ends with the usage and cost when the client asked for
them, and turns a failure into an error event. `StreamSettlement` charges and audits the
stream exactly once however it ends, in a task the request's cancellation cannot reach.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

from switchyard.budgets.pricing import estimate_call
from switchyard.budgets.tokens import output_tokens_upper_bound
from switchyard.gateway.attempts import ChainLog, close_stream_soon
from switchyard.gateway.billing import bill, total_usd
from switchyard.gateway.errors import DeadlineExceeded, ProviderFailure, internal_error
from switchyard.gateway.outcome import Outcome
from switchyard.gateway.planning import Plan
from switchyard.gateway.providers.base import Delta, ProviderError
from switchyard.gateway.results import budget_left
from switchyard.gateway.routing import Candidate
from switchyard.gateway.seams import Bill, BillBasis, Headroom, Redacted, Reservation, Usage
from switchyard.gateway.stream_tools import StreamedToolCalls
from switchyard.gateway.wire import chunk_body, sse
from switchyard.policy.models import ErrorClass

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # the pipeline builds settlements; this module does not import it at run time
    from switchyard.gateway.pipeline import GatewayParts


class Settler(Protocol):
    """What a settlement asks of the pipeline that started the stream."""

    parts: GatewayParts

    def bills(self, plan: Plan, redacted: Redacted, chain: ChainLog) -> list[Bill]: ...

    async def charge(self, plan: Plan, o: Outcome, reservation: Reservation, bills: list[Bill]) -> float: ...

    async def record_outcome(
        self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog, context: str
    ) -> None: ...

    def own(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...

    async def restate_stand_in(self, plan: Plan, redacted: Redacted, o: Outcome, chain: ChainLog) -> None: ...


async def stream_body(
    parts: GatewayParts,
    plan: Plan,
    redacted: Redacted,
    end: StreamSettlement,
    model: str,
    first: Delta,
    rest: AsyncIterator[Delta],
) -> AsyncIterator[bytes]:
    """After the first byte there is no fallback: a failure ends the stream with an error
    event (OpenAI's SDK raises it as an APIError), and what was streamed is charged."""
    ctx = plan.ctx
    provider, outcome = end.outcome.provider or "none", end.outcome
    created = int(ctx.received_at)
    restorer = parts.redactor.restorer(redacted)
    parts_out = end.streamed
    try:
        # The provider's first piece is in hand (the chain waited for it before answering).
        parts.metrics.first_token(ctx.team, ctx.flow.flow, provider, parts.timer() - ctx.started)
        yield sse(chunk_body(ctx.request_id, model, created, role=True, text=""))
        delta = first
        while True:
            if delta.text:
                end.raw.append(delta.text)
                out = restorer.feed(delta.text)
                parts_out.append(out)
                if out:
                    yield sse(chunk_body(ctx.request_id, model, created, text=out))
            if delta.tool_calls:
                pieces = end.calls.feed(delta.tool_calls)
                if pieces:
                    yield sse(chunk_body(ctx.request_id, model, created, tool_calls=pieces))
            if delta.finish_reason is not None:
                end.usage, end.finished = delta.usage, True  # None: it reported none
                tail = restorer.flush()
                if tail:
                    parts_out.append(tail)
                    yield sse(chunk_body(ctx.request_id, model, created, text=tail))
                rest_of_calls = end.calls.flush()
                if rest_of_calls:
                    yield sse(chunk_body(ctx.request_id, model, created, tool_calls=rest_of_calls))
                yield sse(chunk_body(ctx.request_id, model, created, finish_reason=delta.finish_reason))
                break
            remaining = ctx.deadline - parts.timer()
            try:
                async with asyncio.timeout(max(remaining, 0.0)):
                    delta = await anext(rest)
            except StopAsyncIteration:
                raise ProviderError(ErrorClass.CONNECTION, f"{provider} ended the stream early") from None
            except TimeoutError:
                raise DeadlinePassed(ErrorClass.TIMEOUT, "the flow's deadline passed mid-stream") from None
        if plan.request.stream_options is not None and plan.request.stream_options.include_usage:
            # The headers left before the cost was known: it comes with the usage it is charged at.
            usage = end.usage or end.bound_usage()
            yield sse(chunk_body(ctx.request_id, model, created, usage=usage, switchyard=end.charges(usage)))
        yield sse("[DONE]")
    except ProviderError as exc:
        end.failure = exc
        parts.metrics.attempt_failed(provider, exc.error_class.value)
        parts.circuits.breaker(provider).record(exc.error_class)
        err = _stream_error(exc)
        outcome.status, outcome.error_code = err.status, err.code
        yield sse(err.body())
    except Exception:
        # A bug: logged, recorded as the gateway's 500, and the client told so in the stream.
        log.exception("request %s failed mid-stream", ctx.request_id)
        bug = internal_error()
        outcome.status, outcome.error_code = bug.status, bug.code
        yield sse(bug.body())
    except BaseException:
        if outcome.status == 200:  # cancelled or closed mid-stream: the client hung up
            outcome.status, outcome.error_code = 499, "client_disconnected"
        raise
    finally:
        close_stream_soon(rest)  # the provider's response, if it is still open
        await asyncio.shield(end.finish())  # goes on if this request is cancelled


class DeadlinePassed(ProviderError):
    """The flow's deadline passed while a stream waited for its next piece."""


def _stream_error(exc: ProviderError) -> DeadlineExceeded | ProviderFailure:
    """What a stream that failed after its first byte tells its client: the flow's deadline
    passing, the provider going silent for longer than its timeout, or the stream breaking."""
    if isinstance(exc, DeadlinePassed):
        return DeadlineExceeded("deadline_exceeded", exc.message)
    if exc.error_class is ErrorClass.TIMEOUT:
        return DeadlineExceeded("provider_timeout", exc.message)
    return ProviderFailure("stream_interrupted", exc.message)


class StreamSettlement:
    """Settles and audits one streamed request exactly once, however it ends: finished,
    failed mid-stream, its client gone before or after the first token, or its body never
    started. The work runs in a task the pipeline owns, so the request's cancellation
    cannot cut it short."""

    def __init__(
        self,
        pipeline: Settler,
        plan: Plan,
        redacted: Redacted,
        reservation: Reservation,
        chain: ChainLog,
        candidate: Candidate | None,
        outcome: Outcome,
        room: Headroom | None = None,
        *,
        answered: bool = False,
    ) -> None:
        self.pipeline, self.plan, self.redacted = pipeline, plan, redacted
        self.room = room  # what the budget had left when the stream started
        self.reservation, self.chain = reservation, chain
        self.candidate = candidate  # whose stream may be billed; None: no call was under way
        self.answered = answered  # the candidate's stream began: its attempt is the chain's last
        self.outcome = outcome
        if candidate is not None and outcome.provider is None:
            outcome.provider, outcome.model_version = candidate.provider, candidate.entry.model_version
        self.streamed: list[str] = []  # restored text sent so far
        self.raw: list[str] = []  # the provider's text, placeholders and all (what it billed)
        self.calls = StreamedToolCalls(lambda: pipeline.parts.redactor.restorer(redacted))
        self.finished = False  # the provider ended the answer itself
        self.usage: Usage | None = None  # as the provider reported it, if it did
        self._task: asyncio.Task[None] | None = None
        self.stand_in = False  # the pipeline wrote the request's stand-in record (streams only)
        self.failure: ProviderError | None = None  # what ended the stream early, if the provider did

    def finish(self) -> asyncio.Task[None]:
        if self._task is None:
            self._task = self.pipeline.own(self._settle_and_audit())
        return self._task

    def finish_soon(self, loop: asyncio.AbstractEventLoop) -> None:
        """From a finalizer, which may run anywhere: hand the work to the loop."""
        if self._task is None and not loop.is_closed():
            loop.call_soon_threadsafe(self.finish)

    def bound_usage(self) -> Usage:
        """The stream's usage when its provider reported none: the input as estimated and the
        documented upper bound of the output (all of `max_tokens` unless it finished)."""
        assert self.candidate is not None
        plan = self.plan
        catalog, day = plan.policy_set.providers, plan.ctx.day
        inputs = estimate_call(catalog, self.candidate.model, self.redacted.messages, 0, day, plan.tools).input_tokens
        text = "".join(self.raw) + self.calls.raw_text()
        return Usage(inputs, output_tokens_upper_bound(text, plan.max_tokens, finished=self.finished))

    def charges(self, usage: Usage) -> dict[str, Any]:
        """What the stream will be charged for `usage` (settling charges exactly these bills),
        and the budget left after it, for the final usage chunk."""
        assert self.candidate is not None
        plan = self.plan
        bills = self.pipeline.bills(plan, self.redacted, self.chain)
        basis: BillBasis = "bound" if self.usage is None else "reported"
        bills.append(bill(plan.policy_set.providers, self.candidate.model, usage, plan.ctx.day, basis))
        cost = total_usd(bills)
        out: dict[str, Any] = {"cost_usd": round(cost, 8)}
        left = None if self.room is None else budget_left(self.room, self.reservation, cost)
        if left is not None:
            out["budget_remaining_usd"] = round(left, 8)
        return out

    def _end_attempt(self, usage: Usage) -> None:
        """The streamed attempt as it ended, for the bills and the audit record: what it was
        billed (as reported, or the bound when the provider's usage was not read: none sent,
        or the stream failed or its client left first) and how the provider ended it."""
        attempts = self.chain.attempts
        failure = self.failure
        attempts[-1] = dataclasses.replace(
            attempts[-1],
            usage=usage,
            billed_unknown=self.usage is None,
            error_class=None if failure is None else failure.error_class,
            error=None if failure is None else failure.message,
        )

    async def _settle_and_audit(self) -> None:
        p, plan, o = self.pipeline, self.plan, self.outcome
        catalog, day = plan.policy_set.providers, plan.ctx.day
        if self.candidate is None:
            bills = p.bills(plan, self.redacted, self.chain)
        else:
            o.usage = usage = self.usage or self.bound_usage()
            if self.answered:
                self._end_attempt(usage)  # its attempt carries its bill, counted once below
            bills = p.bills(plan, self.redacted, self.chain)
            if not self.answered:
                # Cut off before its first piece: the call in flight may be billed all the same.
                bills.append(bill(catalog, self.candidate.model, usage, day, "bound"))
        o.output_text = "".join(self.streamed)
        o.tool_calls = self.calls.calls()
        o.cost = await p.charge(plan, o, self.reservation, bills)
        if self.stand_in:
            # Charged now: a death before the record below leaves a stand-in with what was
            # streamed; its recovery states the cost the ledger holds (docs/budgets.md).
            await p.restate_stand_in(plan, self.redacted, o, self.chain)
        await p.record_outcome(plan, self.redacted, o, self.chain, context="streamed")
