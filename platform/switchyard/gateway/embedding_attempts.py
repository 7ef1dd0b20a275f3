"""Calling the one model of an embeddings request: within the deadline, through the
provider's circuit, a retryable failure retried on the same model (`RetryPolicy`), the
answer's shape checked before any client sees it, and, when no vectors came, the client's
error naming what was tried. Never another model: vectors of two models are not comparable
(`switchyard.gateway.embeddings`).
"""

from __future__ import annotations

import asyncio
import math
import random

from switchyard.gateway.attempts import CIRCUIT_OPEN, RETRYABLE, ChainLog
from switchyard.gateway.errors import BadRequest, DeadlineExceeded, GatewayError, ProviderFailure, Unavailable
from switchyard.gateway.pipeline import GatewayParts
from switchyard.gateway.providers.base import EmbeddingCall, Embeddings, ProviderError, ProviderOverloaded
from switchyard.gateway.providers.embedding_registry import EmbedderPool
from switchyard.gateway.routing import Candidate
from switchyard.gateway.seams import Attempt, RequestContext, Usage
from switchyard.policy.models import ErrorClass
from switchyard.policy.policy_set import PolicySet

NO_FALLBACK = "embeddings never fall back to another model"


class EmbeddingCaller:
    def __init__(self, parts: GatewayParts, embedders: EmbedderPool, rng: random.Random | None = None) -> None:
        self.parts = parts
        self.embedders = embedders
        self.rng = rng or random.Random()

    async def call(
        self,
        ctx: RequestContext,
        ps: PolicySet,
        cand: Candidate,
        inputs: tuple[str, ...],
        dimensions: int | None,
        log: ChainLog,
    ) -> Embeddings:
        """The model, within the deadline: a `rate_limited`, `server_error` or `connection`
        failure is retried (`RetryPolicy`) on the same model; a billed failure, a timeout or a
        busy in-cluster model is not (as for chat), and nothing else is ever tried."""
        parts = self.parts
        breaker = parts.circuits.breaker(cand.provider)
        embedder = self.embedders.get(cand.provider)
        timeout_cap = ps.providers.providers[cand.provider].timeout_s
        retries = 0
        while True:
            remaining = ctx.deadline - parts.timer()
            if remaining < parts.retry.min_attempt_s:
                raise ProviderError(ErrorClass.TIMEOUT, "no time left in the deadline for another attempt")
            if not breaker.allow():
                parts.metrics.candidate_skipped(cand.provider, CIRCUIT_OPEN)
                err = ProviderError(ErrorClass.CONNECTION, f"the circuit for {cand.provider} is open")
                log.attempts.append(_attempt(cand, parts.clock(), 0.0, err, CIRCUIT_OPEN))
                raise err
            timeout = min(timeout_cap, remaining)
            call = EmbeddingCall(cand.model, cand.entry.model_version, inputs, timeout, ctx.request_id, dimensions)
            started, began = parts.clock(), parts.timer()
            log.current = cand  # stays set if the request is cancelled mid-call: it may be billed
            try:
                async with asyncio.timeout(timeout):
                    answer = await embedder.embed(call)
                check_shape(cand.provider, answer, call)
            except TimeoutError:
                # The call was sent: the provider may finish (and bill) an answer nobody reads.
                error = ProviderError(
                    ErrorClass.TIMEOUT, f"{cand.provider} did not answer within {timeout * 1000:.0f} ms", billed=True
                )
            except ProviderError as exc:
                error = exc
            else:
                log.current = None
                breaker.record(None)
                latency = (parts.timer() - began) * 1000
                usage = Usage(answer.prompt_tokens, 0) if answer.usage_reported else None
                log.attempts.append(
                    Attempt(
                        cand.provider,
                        cand.model,
                        answer.model_version or cand.entry.model_version,
                        started,
                        latency,
                        usage=usage,
                        billed_unknown=usage is None,
                    )
                )
                return answer
            log.current = None
            overloaded = isinstance(error, ProviderOverloaded)
            breaker.record(None if overloaded else error.error_class)  # busy is not broken
            parts.metrics.attempt_failed(cand.provider, error.error_class.value)
            log.attempts.append(_attempt(cand, started, (parts.timer() - began) * 1000, error))
            retryable = error.error_class in RETRYABLE and not overloaded and not error.billed
            if retryable and retries < parts.retry.retries_per_candidate:
                pause = parts.retry.backoff(retries, error.retry_after_s, self.rng)
                if parts.timer() + pause + parts.retry.min_attempt_s < ctx.deadline:
                    retries += 1
                    await asyncio.sleep(pause)
                    continue
            raise error

    def failure(
        self, ctx: RequestContext, ps: PolicySet, cand: Candidate, err: ProviderError, log: ChainLog
    ) -> GatewayError:
        """The client's error when the model produced no vectors, naming what was tried."""
        parts = self.parts
        detail = f"{NO_FALLBACK}; tried: {log.tried()}"
        if parts.timer() >= ctx.deadline:
            ms = round(ctx.deadline_s * 1000)
            return DeadlineExceeded("deadline_exceeded", f"the deadline of {ms} ms passed; {detail}")
        if isinstance(err, ProviderOverloaded):
            settings = ps.org.gateway.admission
            shed = parts.admission.backpressure(settings, cand.provider, ctx.flow.priority, err.queued, err.max_queued)
            parts.metrics.shed(ctx.team, ctx.flow.flow, shed.priority.value, shed.reason)
            wait_s = max(shed.retry_after_s, math.ceil(err.retry_after_s or 0))
            return Unavailable(
                "overloaded",
                f"the model's request queue is full ({err.queued} waiting); {detail}",
                headers={"retry-after": str(wait_s)},
            )
        match err.error_class:
            case ErrorClass.BAD_REQUEST:
                return BadRequest("upstream_rejected_request", f"the provider rejected the request; {detail}")
            case ErrorClass.CONTEXT_LENGTH:
                return BadRequest("context_length_exceeded", f"an input is too long for the model; {detail}")
            case ErrorClass.CONTENT_FILTER:
                return BadRequest("content_filter", f"the provider's content filter refused; {detail}")
            case ErrorClass.RATE_LIMITED | ErrorClass.CONNECTION:
                retry = {"retry-after": str(max(1, math.ceil(err.retry_after_s)))} if err.retry_after_s else {}
                return Unavailable("provider_unavailable", f"the model could not answer; {detail}", headers=retry)
            case ErrorClass.TIMEOUT:
                return DeadlineExceeded("provider_timeout", f"the provider did not answer in time; {detail}")
            case _:
                return ProviderFailure("provider_error", f"the provider failed; {detail}")


def check_shape(provider: str, answer: Embeddings, call: EmbeddingCall) -> None:
    """One vector per input, all of one size (the asked one, if asked): anything else must not
    reach a client's index. The provider answered, so it is billed."""
    sizes = {len(v) for v in answer.vectors}
    if len(answer.vectors) != len(call.inputs) or len(sizes) != 1 or 0 in sizes:
        raise ProviderError(
            ErrorClass.SERVER_ERROR,
            f"{provider} returned {len(answer.vectors)} vectors of {sorted(sizes)} dimensions for "
            f"{len(call.inputs)} inputs",
            billed=True,
        )
    if call.dimensions is not None and sizes != {call.dimensions}:
        raise ProviderError(
            ErrorClass.SERVER_ERROR, f"{provider} returned vectors of {sorted(sizes)} dimensions", billed=True
        )


def _attempt(
    cand: Candidate, started: float, latency_ms: float, err: ProviderError, reason: str | None = None
) -> Attempt:
    return Attempt(
        cand.provider,
        cand.model,
        cand.entry.model_version,
        started,
        latency_ms,
        err.error_class,
        err.message,
        reason,
        billed_unknown=err.billed,
    )
