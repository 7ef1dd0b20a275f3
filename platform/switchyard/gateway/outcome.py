"""A request's fate, as the audit record, the metrics and the trace need it, once it is known."""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.gateway.providers.base import ToolCall
from switchyard.gateway.results import ContractResult
from switchyard.gateway.seams import Bill, Usage


@dataclass(kw_only=True)
class Outcome:
    """What the audit record and the metrics need once a request's fate is known."""

    status: int
    budget_decision: str = "not_reached"
    contract: ContractResult = "not_reached"
    output_text: str | None = None
    tool_calls: tuple[ToolCall, ...] = ()
    provider: str | None = None
    model_version: str | None = None
    usage: Usage | None = None
    cost: float = 0.0
    bills: tuple[Bill, ...] = ()  # what the providers billed, one per billed attempt
    error_code: str | None = None


def cut_short(exc: BaseException) -> Outcome:
    """The record of a request that `exc` ended before its answer: the client hanging up
    (the request cancelled: 499), or a bug in the gateway (an `Exception`: the 500 its client
    is answered), never the one taken for the other."""
    if isinstance(exc, Exception):
        return Outcome(status=500, budget_decision="reserved", error_code="internal_error")
    return Outcome(status=499, budget_decision="reserved", error_code="client_disconnected")
