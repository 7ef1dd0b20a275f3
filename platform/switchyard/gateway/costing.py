"""The actual cost of an answer, from the catalog's price on the day it was made."""

from __future__ import annotations

from datetime import UTC, datetime

from switchyard.gateway.seams import Usage
from switchyard.policy.models import ModelEntry


def cost_usd(entry: ModelEntry, usage: Usage, at: float) -> float:
    price = entry.price_on(datetime.fromtimestamp(at, UTC).date())
    if price is None:
        return 0.0
    cached = min(usage.cached_prompt_tokens, usage.prompt_tokens)
    cached_rate = price.cached_input_per_mtok if price.cached_input_per_mtok is not None else price.input_per_mtok
    return (
        (usage.prompt_tokens - cached) * price.input_per_mtok
        + cached * cached_rate
        + usage.completion_tokens * price.output_per_mtok
    ) / 1_000_000
