"""Which budgets and rate limits apply to a request, from the layered policy.

Budgets: the org cap (`org.yaml: budget`, all teams together), the team's
(`teams/<t>.yaml: budget`), the flow's (`EffectiveFlow.budget`) and, when the deployment sets
one and the request names an end user, a per-user budget. A lower layer may only tighten:
the team's limit is capped by the org's guardrail and cap, and the flow's by the team's (the
loader already rejects a team above the guardrail; clamping here keeps the ledger safe even
for a policy set that was loaded without checks).

A limit a layer leaves out is inherited, per period: a team's is the guardrail's `max` (capped
by the org cap, `team_ceiling`), a flow's or a user's is the team's effective limit. So a team
without a `budget` is held to the guardrail, not only to the org cap. Only limits a flow or user
sets get a ledger line of their own: an inherited one equals the team's limit over a subset of
the team's spend, so the team line already refuses everything it would.
"""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.budgets.money import usd_to_nanos
from switchyard.budgets.periods import Period, period_end, period_label
from switchyard.policy.models import BudgetLimits, RateLimit
from switchyard.policy.policy_set import PolicySet


@dataclass(frozen=True)
class BudgetLine:
    """One hard limit in one period, e.g. `team:support:day:2026-11-30` at $150."""

    key: str
    limit_nanos: int
    resets_at: str  # ISO 8601, UTC
    soft_alerts: tuple[float, ...] = ()

    @property
    def scope(self) -> str:
        return self.key.split(":", 1)[0]


@dataclass(frozen=True)
class RateLine:
    """One rate limit: `per_minute` requests or tokens for one key."""

    key: str  # e.g. "team:support:rpm"
    per_minute: int


def _min(*values: float | None) -> float | None:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _clamped(limits: BudgetLimits | None, ceiling: BudgetLimits) -> BudgetLimits:
    """The limits a layer sets, each capped by the ceiling; those it leaves out stay unset."""
    own = limits or BudgetLimits()
    return BudgetLimits(
        day_usd=_min(own.day_usd, ceiling.day_usd) if own.day_usd is not None else None,
        month_usd=_min(own.month_usd, ceiling.month_usd) if own.month_usd is not None else None,
        soft_alerts=own.soft_alerts,
    )


def _inherited(limits: BudgetLimits | None, ceiling: BudgetLimits) -> BudgetLimits:
    """The limits a layer sets, capped by the ceiling; those it leaves out, the ceiling's."""
    own = limits or BudgetLimits()
    return BudgetLimits(
        day_usd=_min(own.day_usd, ceiling.day_usd),
        month_usd=_min(own.month_usd, ceiling.month_usd),
        soft_alerts=own.soft_alerts,
    )


def _lines(scope: str, limits: BudgetLimits, now: float) -> list[BudgetLine]:
    out = []
    for period, usd in ((Period.DAY, limits.day_usd), (Period.MONTH, limits.month_usd)):
        if usd is None:
            continue
        out.append(
            BudgetLine(
                f"{scope}:{period.value}:{period_label(period, now)}",
                usd_to_nanos(usd),
                period_end(period, now).isoformat(),
                limits.soft_alerts,
            )
        )
    return out


def team_ceiling(ps: PolicySet) -> BudgetLimits:
    """The most a team may set: the org guardrail's `max`, and never more than the org cap."""
    g = ps.org.guardrails
    day = g["budget.day_usd"].max if "budget.day_usd" in g else None
    month = g["budget.month_usd"].max if "budget.month_usd" in g else None
    cap = ps.org.budget
    return BudgetLimits(day_usd=_min(day, cap.day_usd), month_usd=_min(month, cap.month_usd))


def team_limits(ps: PolicySet, team: str) -> BudgetLimits:
    """The team's effective limits: what `teams/<t>.yaml: budget` sets, capped by the
    `team_ceiling`; a period it leaves out (or no `budget` at all), the ceiling itself."""
    own = ps.teams[team].budget if team in ps.teams else None
    return _inherited(own, team_ceiling(ps))


def flow_limits(ps: PolicySet, team: str, flow_budget: BudgetLimits) -> BudgetLimits:
    """A flow's (or an end user's) effective limits: its own, capped by the team's effective
    limits; a period it leaves out, the team's."""
    return _inherited(flow_budget, team_limits(ps, team))


def applicable_budgets(
    ps: PolicySet,
    team: str,
    flow: str,
    flow_budget: BudgetLimits,
    user: str | None,
    now: float,
    per_user: BudgetLimits | None = None,
) -> tuple[BudgetLine, ...]:
    """Every hard limit a request must fit, most general first (see the module docstring for
    why inherited flow and user limits get no line of their own)."""
    team_effective = team_limits(ps, team)
    lines = _lines(f"org:{ps.org.org}", ps.org.budget, now)
    lines += _lines(f"team:{team}", team_effective, now)
    lines += _lines(f"flow:{team}/{flow}", _clamped(flow_budget, team_effective), now)
    if user is not None and per_user is not None:
        lines += _lines(f"user:{team}/{user}", _clamped(per_user, team_effective), now)
    return tuple(lines)


def applicable_rate_limits(
    ps: PolicySet, team: str, flow: str, flow_limit: RateLimit
) -> tuple[tuple[RateLine, ...], tuple[RateLine, ...]]:
    """(request limits, token limits) for the team and the flow."""
    requests: list[RateLine] = []
    tokens: list[RateLine] = []
    team_limit = ps.teams[team].rate_limit if team in ps.teams else None
    for scope, limit in ((f"team:{team}", team_limit), (f"flow:{team}/{flow}", flow_limit)):
        if limit is None:
            continue
        if limit.requests_per_minute is not None:
            requests.append(RateLine(f"{scope}:rpm", limit.requests_per_minute))
        if limit.tokens_per_minute is not None:
            tokens.append(RateLine(f"{scope}:tpm", limit.tokens_per_minute))
    return tuple(requests), tuple(tokens)
