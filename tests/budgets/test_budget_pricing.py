"""Prices by effective date, the cost of reported usage, and the estimate before a call."""

from __future__ import annotations

from datetime import date

import pytest
from _budget_helpers import context, shipped

from switchyard.budgets.admission import Admissions
from switchyard.budgets.pricing import UnknownPrice, actual_cost_usd, price_on
from switchyard.budgets.tokens import count_input_tokens
from switchyard.gateway.seams import Usage
from switchyard.policy.models import Price

PS = shipped()


def test_price_is_the_latest_effective_on_the_day() -> None:
    entry = PS.providers.models["gpt-4o-mini"]
    raised = Price(effective=date(2026, 12, 1), input_per_mtok=0.30, output_per_mtok=1.20)
    models = {**PS.providers.models, "gpt-4o-mini": entry.model_copy(update={"prices": (*entry.prices, raised)})}
    catalog = PS.providers.model_copy(update={"models": models})
    assert price_on(catalog, "gpt-4o-mini", date(2026, 11, 30)).input == 150  # n$ per token
    assert price_on(catalog, "gpt-4o-mini", date(2026, 12, 1)).input == 300
    with pytest.raises(UnknownPrice, match=r"models.local-gpt.prices: no price effective on 2025-01-01"):
        price_on(PS.providers, "local-gpt", date(2025, 1, 1))
    with pytest.raises(UnknownPrice, match=r"models.nope: no such model"):
        price_on(PS.providers, "nope", date(2026, 1, 1))


def test_actual_cost_bills_cached_input_at_the_cached_price() -> None:
    # gpt-4o: $2.50 in, $1.25 cached, $10 out per Mtok; 1000 prompt (400 cached), 200 out:
    # 600 * 2.5e-6 + 400 * 1.25e-6 + 200 * 10e-6 = 0.0015 + 0.0005 + 0.002 = $0.004
    usage = Usage(prompt_tokens=1000, completion_tokens=200, cached_prompt_tokens=400)
    assert actual_cost_usd(PS.providers, "gpt-4o", usage, date(2026, 11, 30)) == pytest.approx(0.004, abs=1e-12)
    # Bedrock's Claude has no cached price: cached tokens are billed as input ($3/Mtok).
    no_cache = actual_cost_usd(PS.providers, "bedrock-claude-sonnet", Usage(1000, 0, 1000), date(2026, 1, 1))
    assert no_cache == pytest.approx(0.003, abs=1e-12)


def test_bytes_family_counts_every_utf8_byte() -> None:
    msgs = [{"role": "user", "content": "héllo"}]  # 6 bytes + "user" (4) + 3 framing bytes
    assert count_input_tokens("bytes", msgs) == 13


def test_openai_families_count_exactly_and_the_others_overestimate_english() -> None:
    text = "The quick brown fox jumps over the lazy dog. " * 20  # 201 o200k tokens
    n = count_input_tokens("o200k", [{"role": "user", "content": text}])
    assert n == 201 + 3 + 1 + 3  # text, 3 per message, "user", reply priming
    assert count_input_tokens("claude", [{"role": "user", "content": text}]) == 300 + 4 + 3  # 900 bytes / 3
    assert count_input_tokens("mystery", [{"role": "user", "content": text}]) == 450 + 7


async def test_estimate_uses_max_tokens_or_the_flows_cap() -> None:
    admissions = Admissions(lambda: PS)
    ctx = context(PS)  # support/reply: gpt-4o-mini, max_tokens 512
    msgs = [{"role": "user", "content": "x" * 30}]
    est = admissions.estimate(ctx, "gpt-4o-mini", msgs, 100)
    assert (est.input_tokens, est.max_output_tokens) == (5 + 7, 100)  # "x" * 30 is 5 o200k tokens
    assert est.usd == pytest.approx((12 * 0.15 + 100 * 0.60) / 1e6)
    assert admissions.estimate(ctx, "gpt-4o-mini", msgs, 0).max_output_tokens == 512  # not given
    assert admissions.estimate(ctx, "gpt-4o-mini", msgs, 10_000).max_output_tokens == 512  # capped
