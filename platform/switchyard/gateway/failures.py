"""What a client is told when no candidate answered: one honest status per failure class."""

from __future__ import annotations

import math

from switchyard.gateway.attempts import ChainFailed, ChainLog
from switchyard.gateway.errors import (
    BadRequest,
    ContractViolation,
    DeadlineExceeded,
    GatewayError,
    ProviderFailure,
    Unavailable,
)
from switchyard.gateway.planning import Plan
from switchyard.gateway.providers.base import ProviderOverloaded
from switchyard.policy.models import ErrorClass


def chain_error(plan: Plan, failed: ChainFailed, chain: ChainLog) -> GatewayError:
    """The client-facing error for a route that produced no answer, naming what was tried."""
    tried = chain.tried()
    ctx = plan.ctx
    if failed.deadline_hit:
        ms = round(ctx.deadline_s * 1000)
        return DeadlineExceeded("deadline_exceeded", f"the deadline of {ms} ms passed; tried: {tried}")
    err = failed.error
    if err is None:
        return Unavailable("no_candidate", "no provider could be tried for this flow")
    skipped = "".join(f"; not tried: {s.model} ({s.reason})" for s in plan.route.skipped)
    detail = f"tried: {tried}{skipped}"
    if isinstance(err, ProviderOverloaded):
        # Retry-After is the pipeline's to add: it knows the observed service time.
        return Unavailable(
            "overloaded",
            f"the model's request queue is full ({err.queued} waiting); no other candidate answered; {detail}",
        )
    match err.error_class:
        case ErrorClass.INVALID_OUTPUT:
            return ContractViolation(
                "output_contract_violated",
                f"no answer matched the flow's output schema ({failed.contract_problem}); {detail}",
            )
        case ErrorClass.BAD_REQUEST:
            return BadRequest("upstream_rejected_request", f"the provider rejected the request; {detail}")
        case ErrorClass.CONTEXT_LENGTH:
            return BadRequest("context_length_exceeded", f"the conversation is too long for the model; {detail}")
        case ErrorClass.CONTENT_FILTER:
            return BadRequest("content_filter", f"the provider's content filter refused; {detail}")
        case ErrorClass.RATE_LIMITED | ErrorClass.CONNECTION:
            retry = {"retry-after": str(max(1, math.ceil(err.retry_after_s)))} if err.retry_after_s else {}
            return Unavailable("provider_unavailable", f"no provider could answer; {detail}", headers=retry)
        case ErrorClass.TIMEOUT:
            return DeadlineExceeded("provider_timeout", f"the provider did not answer in time; {detail}")
        case _:
            return ProviderFailure("provider_error", f"the provider failed; {detail}")
