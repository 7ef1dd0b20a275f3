"""What a request's chain may bill, and what it did bill, in nano-dollars from the catalog.

The reservation covers the whole chain before the first call (`chain_bound`): a fallback to
a pricier model, or a repair of an answer that broke the output contract, can never spend
money the ledger did not hold. The charge is the sum over every attempt a provider billed,
each at the price of the model that billed it (`Bill`); the ledger keeps one row per bill,
so spend names the model that was paid.

Which attempts are billed: an answer (valid or not: a provider bills the tokens it produced),
a stream however far it got, a 200 whose body does not parse, is not the wire format or is cut
off (`providers/answers.py`), and a call we gave up on (a
timeout: the provider may still finish it, and bill it, after we stopped listening). Errors
the provider answered (5xx, 429) and refused connections are not. An attempt billed without
a usage we could read is charged the documented upper bound: its input as estimated and all
of `max_tokens` (`budgets.tokens.output_tokens_upper_bound` for a stream that finished).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import date
from typing import Any

from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.pricing import CallEstimate, entry_price, estimate_call, model_entry
from switchyard.budgets.tokens import count_input_tokens
from switchyard.gateway.routing import Candidate
from switchyard.gateway.seams import Attempt, Bill, BillBasis, CostEstimate, Usage
from switchyard.policy.models import ProviderCatalog

REPAIR_INSTRUCTION_TOKENS = 64  # the repair turn's instruction, generously (it is ~25 tokens)


def chain_bound(
    catalog: ProviderCatalog,
    candidates: Sequence[Candidate],
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
    repairs: bool,
    day: date,
    tools: Sequence[Mapping[str, Any]] = (),
) -> CostEstimate:
    """The most the chain may bill: each candidate's answer at `max_tokens`, plus one repair
    turn each when the flow has an output contract (`repairs`). Raises `UnknownPrice`."""
    total = 0
    primary = None
    counted: dict[str, int] = {}  # input tokens per tokenizer family: candidates often share one
    for cand in candidates:
        family = model_entry(catalog, cand.model).family
        if family not in counted:
            counted[family] = count_input_tokens(family, messages, tools)
        nanos = entry_price(cand.model, cand.entry, day).estimate_nanos(counted[family], max_tokens)
        est = CallEstimate(cand.model, counted[family], max_tokens, nanos)
        primary = primary or est
        total += est.nanos
        if repairs:  # the repair re-sends the input, the rejected answer and an instruction
            price = entry_price(cand.model, cand.entry, day)
            total += price.estimate_nanos(est.input_tokens + max_tokens + REPAIR_INSTRUCTION_TOKENS, max_tokens)
    assert primary is not None, "a route has at least one candidate"
    return CostEstimate(primary.model, primary.input_tokens, max_tokens, nanos_to_usd(total), total)


def bill(catalog: ProviderCatalog, model: str, usage: Usage, day: date, basis: BillBasis) -> Bill:
    return Bill(model, usage, entry_price(model, catalog.models[model], day).cost_nanos(usage), basis)


def billed_attempts(
    catalog: ProviderCatalog,
    attempts: Sequence[Attempt],
    day: date,
    messages: Sequence[dict[str, Any]],
    max_tokens: int,
    tools: Sequence[Mapping[str, Any]] = (),
) -> list[Bill]:
    """The bills of the attempts a provider billed: at the usage it reported, or, for an
    answer without (readable) usage, the bound: the one the attempt carries (a stream's, from
    what it streamed), else the input as estimated and all of `max_tokens`."""
    bills = []
    for a in attempts:
        if a.usage is not None:
            bills.append(bill(catalog, a.model, a.usage, day, "bound" if a.billed_unknown else "reported"))
        elif a.billed_unknown:
            inputs = estimate_call(catalog, a.model, messages, 0, day, tools).input_tokens
            bills.append(bill(catalog, a.model, Usage(inputs, max_tokens), day, "bound"))
    return bills


def total_usd(bills: Sequence[Bill]) -> float:
    return nanos_to_usd(sum(b.nanos for b in bills))
