"""Which budgets and rate limits apply, from the layered policy; lower layers only tighten."""

from __future__ import annotations

from datetime import UTC, datetime

from _budget_helpers import NOON, shipped, with_limits

from switchyard.budgets.resolve import applicable_budgets, applicable_rate_limits
from switchyard.policy.models import BudgetLimits, RateLimit

PS = shipped()


def test_org_team_and_flow_lines_with_their_periods() -> None:
    ps = with_limits(PS, flow_budget=("reply", BudgetLimits(day_usd=20)))
    flow = ps.teams["support"].flows["reply"].budget
    assert flow is not None
    lines = applicable_budgets(ps, "support", "reply", flow, None, NOON)
    assert [(line.key, line.limit_nanos) for line in lines] == [
        ("org:acme:day:2026-11-30", 2000 * 10**9),
        ("org:acme:month:2026-11", 40000 * 10**9),
        ("team:support:day:2026-11-30", 150 * 10**9),
        ("team:support:month:2026-11", 3000 * 10**9),
        ("flow:support/reply:day:2026-11-30", 20 * 10**9),
    ]
    assert lines[0].resets_at == "2026-12-01T00:00:00+00:00"
    assert lines[1].resets_at == "2026-12-01T00:00:00+00:00"
    assert lines[0].soft_alerts == (0.8, 0.95)


def test_a_team_cannot_exceed_the_org_guardrail_and_a_flow_not_its_team() -> None:
    ps = with_limits(PS, team_budget=BudgetLimits(day_usd=900), flow_budget=("reply", BudgetLimits(day_usd=5000)))
    lines = {
        line.key: line.limit_nanos
        for line in applicable_budgets(ps, "support", "reply", BudgetLimits(day_usd=5000), None, NOON)
    }
    assert lines["team:support:day:2026-11-30"] == 500 * 10**9  # guardrail budget.day_usd max 500
    assert lines["flow:support/reply:day:2026-11-30"] == 500 * 10**9


def test_per_user_budget_applies_only_with_a_user() -> None:
    per_user = BudgetLimits(day_usd=1)
    with_user = applicable_budgets(PS, "support", "reply", BudgetLimits(), "alice", NOON, per_user)
    assert with_user[-1].key == "user:support/alice:day:2026-11-30"
    without = applicable_budgets(PS, "support", "reply", BudgetLimits(), None, NOON, per_user)
    assert not any(line.scope == "user" for line in without)


def test_month_rolls_over_at_utc_midnight() -> None:
    last_second = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp()
    keys = [line.key for line in applicable_budgets(PS, "support", "reply", BudgetLimits(), None, last_second)]
    assert "team:support:month:2026-12" in keys
    after = [line.key for line in applicable_budgets(PS, "support", "reply", BudgetLimits(), None, last_second + 1)]
    assert "team:support:month:2027-01" in after and "team:support:day:2027-01-01" in after


def test_rate_limits_per_team_and_flow() -> None:
    ps = with_limits(PS, team_rate=RateLimit(requests_per_minute=60, tokens_per_minute=1000))
    requests, tokens = applicable_rate_limits(ps, "support", "reply", RateLimit(requests_per_minute=10))
    assert [(r.key, r.per_minute) for r in requests] == [("team:support:rpm", 60), ("flow:support/reply:rpm", 10)]
    assert [(t.key, t.per_minute) for t in tokens] == [("team:support:tpm", 1000)]
