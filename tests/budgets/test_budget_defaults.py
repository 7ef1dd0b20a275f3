"""A budget left out inherits the org guardrail's `max`; an explicit `null` is a violation
(issue 15, finding 6: a team without a budget was bounded only by the org cap)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from _budget_helpers import NOON

from switchyard.budgets.resolve import applicable_budgets
from switchyard.cli import main
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import BudgetLimits
from switchyard.policy.policy_set import PolicySet

SUPPORT_BUDGET = "budget: {day_usd: 150, month_usd: 3000}\n"


def _edit_support(policies: Path, new_budget: str) -> None:
    team = policies / "teams/support.yaml"
    text = team.read_text()
    assert SUPPORT_BUDGET in text, "test setup: support's budget line moved"
    team.write_text(text.replace(SUPPORT_BUDGET, new_budget, 1))


def _limits(ps: PolicySet) -> dict[str, int]:
    lines = applicable_budgets(ps, "support", "reply", BudgetLimits(), None, NOON)
    return {line.key: line.limit_nanos for line in lines}


def test_a_team_without_a_budget_is_limited_by_the_guardrail_max(policies_copy: Path) -> None:
    _edit_support(policies_copy, "")
    ps = load_policy_set(policies_copy)  # still a valid policy set
    assert ps.teams["support"].budget is None
    lines = _limits(ps)
    # org.yaml guardrails: budget.day_usd {max: 500}, budget.month_usd {max: 8000}; the org cap
    # (2000 / 40000) is higher, so the guardrail is the limit.
    assert lines["team:support:day:2026-11-30"] == 500 * 10**9
    assert lines["team:support:month:2026-11"] == 8000 * 10**9


def test_policy_explain_shows_the_inherited_budget(policies_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _edit_support(policies_copy, "")
    args = ["policy", "explain", "--team", "support", "--flow", "reply", "--policies", str(policies_copy), "--json"]
    assert main(args) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["policy"]["budget"]["day_usd"], shown["policy"]["budget"]["month_usd"]) == (500, 8000)
    assert "org.yaml guardrails" in shown["set_by"]["budget"]


def test_a_team_budget_that_leaves_out_a_period_inherits_that_periods_max(policies_copy: Path) -> None:
    _edit_support(policies_copy, "budget: {day_usd: 150}\n")
    ps = load_policy_set(policies_copy)
    lines = _limits(ps)
    assert lines["team:support:day:2026-11-30"] == 150 * 10**9
    assert lines["team:support:month:2026-11"] == 8000 * 10**9


def test_a_null_budget_is_a_violation_naming_the_file_and_field(policies_copy: Path) -> None:
    _edit_support(policies_copy, "budget: {day_usd: null, month_usd: 3000}\n")
    ads = policies_copy / "teams/ads.yaml"
    ads.write_text(ads.read_text().replace("  assistant:\n", "  assistant:\n    budget: {month_usd: null}\n", 1))
    with pytest.raises(PolicyError) as info:
        load_policy_set(policies_copy)
    found = [str(v) for v in info.value.violations]
    assert any(v.startswith("teams/support.yaml: budget.day_usd: is null") for v in found), found
    assert any(v.startswith("teams/ads.yaml: flows.assistant.budget.month_usd: is null") for v in found), found
