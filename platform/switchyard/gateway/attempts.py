"""Running a route: attempts in order, with retries, circuit breakers, the deadline, and the
output contract, until one candidate answers or the rules say stop.

Bounds: each candidate is tried at most once plus `retries_per_candidate` retries plus one
contract repair, and each model appears once in a route, so a chain always ends.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.contracts import OutputContracts, OutputSpec
from switchyard.gateway.metrics import GatewayMetrics
from switchyard.gateway.providers.base import (
    ChatProvider,
    Completion,
    Delta,
    ProviderCall,
    ProviderError,
    ProviderOverloaded,
)
from switchyard.gateway.routing import Candidate, falls_back
from switchyard.gateway.seams import Attempt, RequestContext
from switchyard.gateway.tracing import AttemptSpan, GatewayTracing, RequestSpan
from switchyard.policy.models import ErrorClass
from switchyard.policy.policy_set import PolicySet

T = TypeVar("T")
RETRYABLE = frozenset({ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR, ErrorClass.CONNECTION})
CIRCUIT_OPEN = "circuit_open"
REPAIR_INSTRUCTION = "Your answer did not match the required JSON schema ({problem}). Reply again with JSON only."


def close_stream_soon(stream: AsyncIterator[Delta]) -> None:
    """Close a provider stream nobody will read on (its HTTP response and connection), in the
    background: the caller may be in a cancelled scope where an await would not run."""
    close = getattr(stream, "aclose", None)
    if close is not None:
        task = asyncio.get_running_loop().create_task(close())
        task.add_done_callback(_closed)


def _closed(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logging.getLogger(__name__).warning("closing a provider stream failed: %s", task.exception())


@dataclass(frozen=True)
class RetryPolicy:
    retries_per_candidate: int = 1
    base_backoff_s: float = 0.05
    max_backoff_s: float = 2.0
    min_attempt_s: float = 0.02  # do not start an attempt with less time left than this

    def backoff(self, retry: int, retry_after_s: float | None, rng: random.Random) -> float:
        # Full jitter (AWS architecture blog): spreads retries of many clients apart.
        jittered = rng.uniform(0, min(self.max_backoff_s, self.base_backoff_s * 2**retry))
        return max(jittered, retry_after_s or 0.0)


@dataclass
class Answer(Generic[T]):
    value: T
    candidate: Candidate
    text_for_contract: str | None = None


@dataclass
class ChainLog:
    """What the chain did, for the response headers, metrics and the audit record."""

    attempts: list[Attempt] = field(default_factory=list)
    hops: list[str] = field(default_factory=list)  # "model:reason" for every fallback taken
    current: Candidate | None = None  # the candidate whose call is in flight, if any

    def header(self) -> str:
        return ",".join(self.hops) if self.hops else "none"

    def tried(self) -> str:
        return (
            ", ".join(f"{a.model} ({a.error_class.value if a.error_class else 'ok'})" for a in self.attempts)
            or "nothing"
        )


@dataclass(frozen=True)
class ChainRequest:
    """One request's run over its route: everything every attempt of it needs."""

    ps: PolicySet
    ctx: RequestContext
    candidates: tuple[Candidate, ...]
    messages: list[dict[str, Any]]  # as sent (redacted)
    max_tokens: int
    base: ProviderCall  # the request's sampling settings and tools; model, timeout, messages vary
    log: ChainLog
    output: OutputSpec | None = None  # the contract every answer must keep
    span: RequestSpan | None = None  # the request's trace span: each attempt is a child of it


class ChainFailed(Exception):
    def __init__(self, error: ProviderError | None, deadline_hit: bool, contract_problem: str | None = None) -> None:
        super().__init__(error.message if error else "deadline exceeded")
        self.error = error
        self.deadline_hit = deadline_hit
        self.contract_problem = contract_problem


Opener = Callable[[ChatProvider, ProviderCall], Awaitable[T]]


class AttemptRunner:
    def __init__(
        self,
        providers: Callable[[str], ChatProvider],
        circuits: CircuitBoard,
        metrics: GatewayMetrics,
        contracts: OutputContracts,
        retry: RetryPolicy,
        clock: Callable[[], float] = time.time,
        timer: Callable[[], float] = time.monotonic,
        rng: random.Random | None = None,
        tracing: GatewayTracing | None = None,
    ) -> None:
        self.providers = providers
        self.circuits = circuits
        self.metrics = metrics
        self.contracts = contracts
        self.retry = retry
        self.clock = clock  # an attempt's start, as a timestamp
        self.timer = timer  # its latency and the deadline (see `RequestContext`)
        self.rng = rng or random.Random()
        self.tracing = tracing or GatewayTracing()

    def _attempt_span(self, req: ChainRequest, cand: Candidate) -> AttemptSpan | None:
        if req.span is None:
            return None
        kind = req.ps.providers.providers[cand.provider].kind.value
        return self.tracing.start_attempt(
            req.span,
            provider=cand.provider,
            provider_kind=kind,
            model=cand.model,
            model_version=cand.entry.model_version,
        )

    async def complete(self, req: ChainRequest, restore: Callable[[str], str]) -> Answer[Completion]:
        async def open_complete(provider: ChatProvider, call: ProviderCall) -> Completion:
            return await provider.complete(call)

        return await self._run(req, open_complete, restore)

    async def stream(self, req: ChainRequest) -> Answer[tuple[Delta, AsyncIterator[Delta]]]:
        async def open_stream(provider: ChatProvider, call: ProviderCall) -> tuple[Delta, AsyncIterator[Delta]]:
            it = provider.stream(call)
            try:
                first = await anext(it)
            except StopAsyncIteration:
                raise ProviderError(ErrorClass.SERVER_ERROR, f"{provider.name} sent an empty stream") from None
            except BaseException:
                close_stream_soon(it)  # timed out or cancelled: release the provider's connection
                raise
            return first, it

        return await self._run(req, open_stream, None)

    async def _run(self, req: ChainRequest, opener: Opener[T], restore: Callable[[str], str] | None) -> Answer[T]:
        candidates, log = req.candidates, req.log
        last: ProviderError | None = None
        contract_problem: str | None = None
        i = 0
        while i < len(candidates):
            cand = candidates[i]
            nxt = candidates[i + 1] if i + 1 < len(candidates) else None
            outcome = await self._candidate(req, cand, nxt, opener, restore)
            if isinstance(outcome, Answer):
                return outcome
            last, reason, contract_problem = outcome
            if self.timer() >= req.ctx.deadline:
                raise ChainFailed(last, deadline_hit=True, contract_problem=contract_problem)
            if nxt is None or not falls_back(last.error_class, nxt):
                break
            log.hops.append(f"{cand.model}:{reason}")
            self.metrics.fallback(cand.provider, nxt.provider, reason)
            i += 1
        raise ChainFailed(last, deadline_hit=False, contract_problem=contract_problem)

    async def _candidate(
        self,
        req: ChainRequest,
        cand: Candidate,
        nxt: Candidate | None,
        opener: Opener[T],
        restore: Callable[[str], str] | None,
    ) -> Answer[T] | tuple[ProviderError, str, str | None]:
        """Try one candidate (with its retries and one repair); the answer, or why it failed."""
        ctx, log, base, messages = req.ctx, req.log, req.base, req.messages
        breaker = self.circuits.breaker(cand.provider)
        provider = self.providers(cand.provider)
        timeout_cap = req.ps.providers.providers[cand.provider].timeout_s
        retries = 0
        repaired = False
        contract_problem: str | None = None
        while True:
            remaining = ctx.deadline - self.timer()
            if remaining < self.retry.min_attempt_s:
                err = ProviderError(ErrorClass.TIMEOUT, "no time left in the deadline for another attempt")
                return err, ErrorClass.TIMEOUT.value, contract_problem
            if not breaker.allow():
                self.metrics.candidate_skipped(cand.provider, CIRCUIT_OPEN)
                err = ProviderError(ErrorClass.CONNECTION, f"the circuit for {cand.provider} is open")
                log.attempts.append(
                    Attempt(
                        cand.provider,
                        cand.model,
                        cand.entry.model_version,
                        self.clock(),
                        0.0,
                        ErrorClass.CONNECTION,
                        err.message,
                        CIRCUIT_OPEN,
                    )
                )
                return err, CIRCUIT_OPEN, None
            timeout = min(timeout_cap, remaining)
            call = replace(
                base,
                model=cand.model,
                model_version=cand.entry.model_version,
                messages=messages,
                max_tokens=req.max_tokens,
                timeout_s=timeout,
                request_id=ctx.request_id,
                output=None if req.output is None else req.output.as_format(cand.entry.capabilities.json_schema),
            )
            started, began = self.clock(), self.timer()
            log.current = cand  # stays set if the request is cancelled mid-call: it may be billed
            span = self._attempt_span(req, cand)
            try:
                async with asyncio.timeout(timeout):
                    value = await opener(provider, call)
            except asyncio.CancelledError:
                _span_ended(span, "cancelled")
                raise
            except TimeoutError:
                # The call was sent: the provider may finish (and bill) an answer nobody reads.
                error: ProviderError = ProviderError(
                    ErrorClass.TIMEOUT, f"{cand.provider} did not answer within {timeout * 1000:.0f} ms", billed=True
                )
            except ProviderError as exc:
                error = exc
            else:
                log.current = None
                breaker.record(None)
                latency = (self.timer() - began) * 1000
                problem = None
                if isinstance(value, Completion) and restore is not None and not value.tool_calls:
                    # A turn that calls tools is not the final answer: the contract waits for it.
                    problem = self.contracts.problem(req.output, restore(value.text))
                _span_answered(span, value, problem)
                # A stream's usage comes at its end; an answer without usage is billed at the bound.
                reported = isinstance(value, Completion) and value.usage_reported
                billed = value.usage if isinstance(value, Completion) and reported else None
                unknown = isinstance(value, Completion) and not reported
                answered = Attempt(  # billed whether or not it keeps the contract
                    cand.provider,
                    cand.model,
                    cand.entry.model_version,
                    started,
                    latency,
                    usage=billed,
                    billed_unknown=unknown,
                )
                if problem is None:
                    log.attempts.append(answered)
                    return Answer(value, cand)
                contract_problem = problem
                error = ProviderError(
                    ErrorClass.INVALID_OUTPUT, f"{cand.model}'s answer broke the output contract {problem}"
                )
                log.attempts.append(replace(answered, error_class=ErrorClass.INVALID_OUTPUT, error=error.message))
                self.metrics.attempt_failed(cand.provider, ErrorClass.INVALID_OUTPUT.value)
                if not repaired and (nxt is None or ErrorClass.INVALID_OUTPUT not in nxt.on_errors):
                    # The rule does not move on for invalid output: one repair attempt here.
                    repaired = True
                    assert isinstance(value, Completion)
                    messages = [
                        *messages,
                        {"role": "assistant", "content": value.text},
                        {
                            "role": "user",
                            "content": REPAIR_INSTRUCTION.format(problem=problem),
                        },
                    ]
                    continue
                return error, ErrorClass.INVALID_OUTPUT.value, contract_problem
            log.current = None
            _span_ended(span, error.error_class.value)
            overloaded = isinstance(error, ProviderOverloaded)
            breaker.record(None if overloaded else error.error_class)  # busy is not broken
            self.metrics.attempt_failed(cand.provider, error.error_class.value)
            log.attempts.append(
                Attempt(
                    cand.provider,
                    cand.model,
                    cand.entry.model_version,
                    started,
                    (self.timer() - began) * 1000,
                    error.error_class,
                    error.message,
                    billed_unknown=error.billed,
                )
            )
            # A billed failure (a 200 that does not parse) falls back rather than retries: each
            # candidate bills at most one answer and one repair, which is what the chain holds.
            retryable = error.error_class in RETRYABLE and not overloaded and not error.billed
            if retryable and retries < self.retry.retries_per_candidate:
                pause = self.retry.backoff(retries, error.retry_after_s, self.rng)
                if self.timer() + pause + self.retry.min_attempt_s < ctx.deadline:
                    retries += 1
                    await asyncio.sleep(pause)
                    continue
            return error, error.error_class.value, contract_problem


def _span_answered(span: AttemptSpan | None, value: object, problem: str | None) -> None:
    """End an attempt's span: answered (a stream's span ends at its first piece; its usage
    is on the request), or failed as `invalid_output` when the answer broke the contract."""
    if span is None:
        return
    if isinstance(value, Completion):
        span.answered(value.model_version, value.usage, value.finish_reason)
    if problem is not None:
        span.failed(ErrorClass.INVALID_OUTPUT.value)
    span.end()


def _span_ended(span: AttemptSpan | None, error: str) -> None:
    if span is not None:
        span.failed(error)
        span.end()
