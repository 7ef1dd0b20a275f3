"""Prices from the provider catalog (`policies/providers.yaml`) and the cost of a call.

The price that applies is the latest entry whose effective date is on or before the UTC day
of the call. Cached input tokens are part of `prompt_tokens` (as OpenAI and Anthropic report
them) and are billed at the cached price where the model has one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date

from switchyard.budgets.money import per_token_nanos
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


def model_entry(catalog: ProviderCatalog, model: str) -> ModelEntry:
    try:
        return catalog.models[model]
    except KeyError:
        raise UnknownPrice(
            f"providers.yaml: models.{model}: no such model (known: {', '.join(sorted(catalog.models))})"
        ) from None


def price_on(catalog: ProviderCatalog, model: str, day: date) -> TokenPrice:
    entry = model_entry(catalog, model)
    price = entry.price_on(day)
    if price is None:
        first = entry.prices[0].effective.isoformat() if entry.prices else "never"
        raise UnknownPrice(
            f"providers.yaml: models.{model}.prices: no price effective on {day.isoformat()} (first effective: {first})"
        )
    inp = per_token_nanos(price.input_per_mtok)
    cached = inp if price.cached_input_per_mtok is None else per_token_nanos(price.cached_input_per_mtok)
    return TokenPrice(model, inp, per_token_nanos(price.output_per_mtok), cached)


def actual_cost_usd(catalog: ProviderCatalog, model: str, usage: Usage, day: date) -> float:
    """What a call cost, from the usage the provider reported. The gateway passes this to settle."""
    return price_on(catalog, model, day).cost_nanos(usage) / 1e9
