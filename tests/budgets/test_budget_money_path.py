"""One money path (issue 15, finding 8): integer nano-dollars from the catalog, never free.

A model a flow can reach without a price effective today is a `policy check` error; the cost
of reported usage and the estimate are whole nano-dollars computed by hand here; the output
bound for a stream without reported usage is never below the real token count.
"""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from pathlib import Path

import pytest
from _budget_helpers import NOON, shipped
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.budgets import pricing, tokens
from switchyard.gateway.seams import Usage
from switchyard.models.tokenizer import ByteTokenizer
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set
from tests.examples import examples

PS = shipped()
DAY = date(2026, 11, 30)  # NOON's day


def test_a_model_a_flow_reaches_without_a_price_today_fails_policy_check(policies_copy: Path) -> None:
    # claude-haiku is support/reply's fallback; its only price now starts tomorrow.
    tomorrow = datetime.now(UTC).date() + timedelta(days=1)
    providers = policies_copy / "providers.yaml"
    text = providers.read_text()
    assert "{effective: 2025-10-01, input_per_mtok: 1.00" in text, "test setup: claude-haiku's price moved"
    providers.write_text(text.replace("effective: 2025-10-01", f"effective: {tomorrow.isoformat()}", 1))
    with pytest.raises(PolicyError) as info:
        load_policy_set(policies_copy)
    found = [str(v) for v in info.value.violations]
    prefix = "providers.yaml: models.claude-haiku.prices: no price effective on "
    haiku = [v for v in found if v.startswith(prefix)]
    assert len(haiku) == 1, found  # one violation per model, naming every flow that reaches it
    assert "teams/support.yaml: flows.reply.fallback.0.model" in haiku[0]
    assert "teams/support.yaml: flows.reply.allowed_models" in haiku[0]


def test_shipped_models_including_the_in_cluster_ones_have_a_price_today() -> None:
    today = datetime.now(UTC).date()
    for name in ("local-gpt", "local-gpt-cpu"):  # served in-cluster: priced explicitly, not free by omission
        assert PS.providers.models[name].prices, name
        pricing.price_on(PS.providers, name, today)


def test_cost_of_usage_with_cached_tokens_in_nano_dollars() -> None:
    # gpt-4o-mini: $0.15 input, $0.075 cached input, $0.60 output per Mtok
    #   = 150, 75 and 600 nano-dollars per token.
    # 1234 prompt tokens of which 567 cached, 89 completion tokens:
    #   (1234 - 567) * 150 = 667 * 150 = 100_050
    #          567 *  75               =  42_525
    #           89 * 600               =  53_400
    #                            total = 195_975 n$
    usage = Usage(prompt_tokens=1234, completion_tokens=89, cached_prompt_tokens=567)
    assert pricing.usage_cost_nanos(PS.providers, "gpt-4o-mini", usage, DAY) == 195_975
    # The gateway's float shim is the same computation, not a second one.
    assert (
        pricing.usage_cost_nanos(PS.providers, "gpt-4o-mini", usage, datetime.fromtimestamp(NOON, UTC).date())
        == 195_975
    )


def test_a_call_on_a_day_without_a_price_is_never_free() -> None:
    before = datetime(2025, 6, 1, tzinfo=UTC)  # local-gpt is priced from 2026-01-01
    usage = Usage(prompt_tokens=10, completion_tokens=10)
    with pytest.raises(pricing.UnknownPrice, match=r"models\.local-gpt\.prices: no price effective on 2025-06-01"):
        pricing.usage_cost_nanos(PS.providers, "local-gpt", usage, before.date())
    with pytest.raises(pricing.UnknownPrice):
        pricing.usage_cost_nanos(PS.providers, "local-gpt", usage, before.date())


def test_estimate_in_nano_dollars() -> None:
    # o200k: "x" * 30 is 5 tokens + 3 per message + 1 for "user" + 3 reply priming = 12 input
    # tokens; 12 * 150 + 100 max output * 600 = 1_800 + 60_000 = 61_800 n$.
    messages = [{"role": "user", "content": "x" * 30}]
    est = pricing.estimate_call(PS.providers, "gpt-4o-mini", messages, 100, DAY)
    assert (est.model, est.input_tokens, est.max_output_tokens, est.nanos) == ("gpt-4o-mini", 12, 100, 61_800)


@settings(max_examples=examples(300), deadline=None)
@given(st.text())
def test_stream_output_bound_is_at_least_the_real_token_count(text: str) -> None:
    # The real count of switchyard's own model (`bytes`) is its tokenizer's, end-of-text included.
    # A byte-level BPE (o200k, cl100k, claude) never uses more tokens than that: each of its
    # tokens is one or more bytes, so the byte tokenizer is its worst case. (No BPE vocabulary
    # can be loaded here: tiktoken downloads its encodings.)
    real = len(ByteTokenizer().encode(text, add_eot=True))
    assert tokens.output_tokens_upper_bound(text, 10**9, finished=True) >= real


def test_stream_output_bound_is_capped_and_a_cut_stream_counts_everything_it_may_have_billed() -> None:
    assert tokens.output_tokens_upper_bound("x" * 1000, 256, finished=True) == 256
    assert tokens.output_tokens_upper_bound("hi", 256, finished=False) == 256
