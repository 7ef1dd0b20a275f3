"""Prices by effective date, the cost of reported usage, and the estimate before a call."""

from __future__ import annotations

import shutil
import tempfile
from datetime import date
from pathlib import Path

import pytest
import yaml
from _budget_helpers import context, shipped
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.budgets.admission import Admissions
from switchyard.budgets.pricing import UnknownPrice, actual_cost_usd, price_on
from switchyard.budgets.tokens import count_input_tokens
from switchyard.gateway.seams import Usage
from switchyard.paths import repo_root
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import Price
from tests.examples import examples

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


@pytest.mark.parametrize(
    ("per_mtok", "nanos"),
    [(0.075, 75), (2.5, 2500), (1.375, 1375), (0.0625, 63), (0.01875, 19), (0.0004, 1), (0.0, 0), (0.3, 300)],
)
def test_a_price_per_token_is_never_below_the_price(per_mtok: float, nanos: int) -> None:
    """Rounded to nearest, 0.0625 $/Mtok was charged 62 n$/token (0.8% under what the
    provider bills) and 0.0004 was 0: its calls were free."""
    entry = PS.providers.models["gpt-4o-mini"]
    priced = Price(effective=date(2020, 1, 1), input_per_mtok=per_mtok, output_per_mtok=per_mtok)
    models = {**PS.providers.models, "gpt-4o-mini": entry.model_copy(update={"prices": (priced,)})}
    catalog = PS.providers.model_copy(update={"models": models})
    price = price_on(catalog, "gpt-4o-mini", date(2026, 1, 1))
    assert price.input == price.output == nanos
    assert nanos >= per_mtok * 1000 - 1e-9


@pytest.mark.parametrize(
    ("field", "value", "problem"),
    [
        ("input_per_mtok", ".inf", "Input should be a finite number"),
        ("output_per_mtok", ".nan", "Input should be a finite number"),
        ("input_per_mtok", "1.0e+12", "Input should be less than or equal to 1000000"),
    ],
)
def test_policy_check_refuses_a_price_no_call_can_be_charged_at(
    tmp_path: Path, field: str, value: str, problem: str
) -> None:
    """A price of `.inf` passed `policy check`; then every request routed to the model failed
    converting it to nano-dollars (`OverflowError: cannot convert float infinity to integer`)."""
    root = tmp_path / "policies"
    shutil.copytree(repo_root() / "policies", root)
    catalog = root / "providers.yaml"
    text = catalog.read_text()
    shipped_value = {"input_per_mtok": "input_per_mtok: 2.50,", "output_per_mtok": "output_per_mtok: 10.00,"}[field]
    assert shipped_value in text
    catalog.write_text(text.replace(shipped_value, f"{field}: {value},", 1))
    with pytest.raises(PolicyError) as refused:
        load_policy_set(root)
    text = str(refused.value)
    assert "providers.yaml" in text and f"models.gpt-4o.prices.0.{field}" in text and problem in text, text


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


def _numbers(doc: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """The path of every number in a parsed YAML document."""
    if isinstance(doc, dict):
        return [p for key, value in doc.items() for p in _numbers(value, (*path, key))]
    if isinstance(doc, list):
        return [p for i, value in enumerate(doc) for p in _numbers(value, (*path, i))]
    return [path] if isinstance(doc, int | float) and not isinstance(doc, bool) else []


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_any_number_in_the_catalog_is_refused_or_priced_within_the_ledger(data: st.DataObject) -> None:
    """One number of `providers.yaml` (a price, a context window, a timeout...) replaced by
    any float or integer: the set is refused by the field, or every model is priced on every
    day it has a price, never below the catalog's price and never past the ledger's 64-bit
    columns for its largest call."""
    doc = yaml.safe_load((repo_root() / "policies" / "providers.yaml").read_text())
    path = data.draw(st.sampled_from(_numbers(doc)), label="number")
    value = data.draw(st.one_of(st.floats(), st.integers(-(10**20), 10**20)), label="value")
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "policies"
        shutil.copytree(repo_root() / "policies", root)
        (root / "providers.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
        try:
            ps = load_policy_set(root)
        except PolicyError as exc:
            assert "providers.yaml" in str(exc) or "teams/" in str(exc), str(exc)
            return
    for model, entry in ps.providers.models.items():
        for listed in entry.prices:
            price = price_on(ps.providers, model, listed.effective)
            assert price.input >= listed.input_per_mtok * 1000 - 1e-6, (model, listed)
            assert price.output >= listed.output_per_mtok * 1000 - 1e-6, (model, listed)
            assert price.estimate_nanos(entry.context_window, entry.context_window) < 2**63, (model, listed)
