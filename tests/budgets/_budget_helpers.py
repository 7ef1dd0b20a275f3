"""Builders shared by the budget tests: policy sets with chosen limits, request contexts."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from switchyard.gateway.seams import RequestContext
from switchyard.policy.layering import ResolvedFlow, resolve_flow
from switchyard.policy.models import (
    BudgetLimits,
    DataPolicies,
    OrgPolicy,
    ProviderCatalog,
    RateLimit,
    TeamPolicy,
)
from switchyard.policy.policy_set import PolicySet

REPO = Path(__file__).resolve().parents[2]
# A fixed instant in a month with prices for every model: 2026-11-30 12:00 UTC.
NOON = datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp()


def shipped() -> PolicySet:
    """The shipped org, provider and team files, parsed by the policy models directly: these
    tests depend on budgets, prices and flows, not on every other file in the set (the full
    load is `switchyard.policy`'s to test)."""
    root = REPO / "policies"

    def read(rel: str) -> Any:
        return yaml.safe_load((root / rel).read_text())

    teams = {p.stem: TeamPolicy.model_validate(read(f"teams/{p.name}")) for p in (root / "teams").glob("*.yaml")}
    return PolicySet(
        root=root,
        org=OrgPolicy.model_validate(read("org.yaml")),
        teams=teams,
        providers=ProviderCatalog.model_validate(read("providers.yaml")),
        data=DataPolicies.model_validate(read("data_policies.yaml")),
        prompts={},
        scheduler={},
    )


def with_limits(
    ps: PolicySet,
    team: str = "support",
    team_budget: BudgetLimits | None = None,
    org_budget: BudgetLimits | None = None,
    team_rate: RateLimit | None = None,
    flow_budget: tuple[str, BudgetLimits] | None = None,
) -> PolicySet:
    """A copy of `ps` with one team's budget/rate limit, the org cap or a flow budget replaced."""
    t = ps.teams[team]
    updates: dict[str, object] = {}
    if team_budget is not None:
        updates["budget"] = team_budget
    if team_rate is not None:
        updates["rate_limit"] = team_rate
    if flow_budget is not None:
        name, limits = flow_budget
        flows = dict(t.flows)
        flows[name] = flows[name].model_copy(update={"budget": limits})
        updates["flows"] = flows
    teams = {**ps.teams, team: t.model_copy(update=updates)}
    org = ps.org if org_budget is None else ps.org.model_copy(update={"budget": org_budget})
    return PolicySet(ps.root, org, teams, ps.providers, ps.data, ps.prompts, ps.scheduler, ps.file_hashes)


def context(
    ps: PolicySet, team: str = "support", flow: str = "reply", user: str | None = None, at: float = NOON
) -> RequestContext:
    resolved = resolve_flow(ps, team, flow)
    assert isinstance(resolved, ResolvedFlow), resolved
    return RequestContext(
        request_id=uuid.uuid4().hex,
        received_at=at,
        started=0.0,
        team=team,
        key_id="k1",
        user=user,
        flow=resolved.policy,
        requested_model="auto",
        prompt_ref="p@1#0",
        idempotency_key=None,
        deadline=30.0,
        stream=False,
    )


class FixedClock:
    def __init__(self, now: float = NOON) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def wall_clock_ctx(ps: PolicySet, **kw: object) -> RequestContext:
    return context(ps, at=time.time(), **kw)  # type: ignore[arg-type]
