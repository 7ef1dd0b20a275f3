"""The one money path: prices from the provider catalog (`policies/providers.yaml`), the cost
of a call and the estimate before it, in integer nano-dollars.

The price that applies is the latest entry whose effective date is on or before the UTC day
of the call. A model with no such entry has no price: every function here raises
`UnknownPrice` rather than answering zero, so a call is never free by omission
(`switchyard policy check` rejects a flow that can reach such a model today). Cached input
tokens are part of `prompt_tokens` (as OpenAI and Anthropic report them) and are billed at the
cached price where the model has one, else at the input price.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date
from typing import Any

from switchyard.budgets.money import nanos_to_usd, per_token_nanos
from switchyard.budgets.tokens import count_input_tokens
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ModelEntry, ProviderCatalog


class UnknownPrice(Exception):
    """The catalog has no model of this name, or no price effective on the day asked."""


@dataclass(frozen=True)
class TokenPrice:
    """Nano-dollars per token for one model on one day."""

    model: str
    input: int
    output: int
    cached_input: int

    def cost_nanos(self, usage: Usage) -> int:
        cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
        fresh = usage.prompt_tokens - cached
        return fresh * self.input + cached * self.cached_input + usage.completion_tokens * self.output

    def estimate_nanos(self, input_tokens: int, max_output_tokens: int) -> int:
        # Every input token at the full price: a cache hit is not known before the call.
        return input_tokens * self.input + max_output_tokens * self.output


@dataclass(frozen=True)
class CallEstimate:
    """The most a call may cost before it is made: estimated input, the output cap, its price."""

    model: str
    input_tokens: int
    max_output_tokens: int
    nanos: int


def model_entry(catalog: ProviderCatalog, model: str) -> ModelEntry:
    try:
        return catalog.models[model]
    except KeyError:
        raise UnknownPrice(
            f"providers.yaml: models.{model}: no such model (known: {', '.join(sorted(catalog.models))})"
        ) from None


def entry_price(model: str, entry: ModelEntry, day: date) -> TokenPrice:
    """`entry`'s price on `day` (`model` is its catalog name, for the error message)."""
    price = entry.price_on(day)
    if price is None:
        first = entry.prices[0].effective.isoformat() if entry.prices else "never"
        raise UnknownPrice(
            f"providers.yaml: models.{model}.prices: no price effective on {day.isoformat()} (first effective: {first})"
        )
    inp = per_token_nanos(price.input_per_mtok)
    cached = inp if price.cached_input_per_mtok is None else per_token_nanos(price.cached_input_per_mtok)
    return TokenPrice(model, inp, per_token_nanos(price.output_per_mtok), cached)


def price_on(catalog: ProviderCatalog, model: str, day: date) -> TokenPrice:
    return entry_price(model, model_entry(catalog, model), day)


def usage_cost_nanos(catalog: ProviderCatalog, model: str, usage: Usage, day: date) -> int:
    """What a call cost, from the usage the provider reported, at `model`'s price on `day`."""
    return price_on(catalog, model, day).cost_nanos(usage)


def estimate_call(
    catalog: ProviderCatalog,
    model: str,
    messages: Sequence[dict[str, Any]],
    max_output_tokens: int,
    day: date,
    tools: Sequence[Mapping[str, Any]] = (),
) -> CallEstimate:
    """Input tokens by the model's tokenizer family (`tokens.count_input_tokens`: exact or an
    upper bound; tool definitions included) plus `max_output_tokens`, every input token at the
    uncached price."""
    entry = model_entry(catalog, model)
    input_tokens = count_input_tokens(entry.family, messages, tools)
    nanos = entry_price(model, entry, day).estimate_nanos(input_tokens, max_output_tokens)
    return CallEstimate(model, input_tokens, max_output_tokens, nanos)


def actual_cost_usd(catalog: ProviderCatalog, model: str, usage: Usage, day: date) -> float:
    """`usage_cost_nanos` in USD, for callers that still speak floats."""
    return nanos_to_usd(usage_cost_nanos(catalog, model, usage, day))
