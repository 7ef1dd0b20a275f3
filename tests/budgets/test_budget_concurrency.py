"""500 concurrent requests from a team whose budget covers exactly 100 of them at the estimate,
through four gates (as four gateway replicas) sharing one ledger, for both gate designs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from _budget_helpers import NOON, context, shipped, with_limits
from _load import MESSAGES, run_load

from switchyard.budgets.admission import Admissions
from switchyard.budgets.direct_gate import DirectBudgetGate
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.money import nanos_to_usd, usd_to_nanos
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.gateway.seams import Bill, BudgetGate, OverBudget, Usage
from switchyard.policy.models import BudgetLimits, RateLimit
from switchyard.policy.policy_set import PolicySet

BASE = shipped()


def estimate_nanos(ps: PolicySet) -> int:
    est = Admissions(lambda: ps).estimate(context(ps), "gpt-4o-mini", MESSAGES, 0)
    return usd_to_nanos(est.usd)


def budget_for(requests: int, **kw: object) -> tuple[PolicySet, int]:
    """The shipped policies with support's daily budget set to `requests` estimates."""
    limit = estimate_nanos(BASE) * requests
    no_rate = RateLimit(requests_per_minute=100_000, tokens_per_minute=10**9)
    ps = with_limits(BASE, team_budget=BudgetLimits(day_usd=nanos_to_usd(limit)), team_rate=no_rate)
    return ps, limit


def make_gates(kind: str, ps: PolicySet, service: LedgerService, n: int) -> list[BudgetGate]:
    admissions = Admissions(lambda: ps)
    client = InProcessLedgerClient(service)
    factory: Callable[[str], BudgetGate] = (
        (lambda h: DirectBudgetGate(admissions, client, h))
        if kind == "direct"
        else (lambda h: LeasedBudgetGate(admissions, client, h))
    )
    return [factory(f"replica-{i}") for i in range(n)]


async def close(gates: list[BudgetGate]) -> None:
    for g in gates:
        if isinstance(g, LeasedBudgetGate):
            await g.aclose()


@pytest.mark.parametrize("kind", ["direct", "leased"])
async def test_500_concurrent_requests_never_overspend(kind: str, ledger: BudgetLedger) -> None:
    ps, limit = budget_for(100)
    service = LedgerService(ledger)
    gates = make_gates(kind, ps, service, 4)
    contexts = [context(ps) for _ in range(500)]
    out = await run_load(gates, contexts, ps.providers)
    await close(gates)

    team_line = next(s for s in service.lines() if s.key == "team:support:day:2026-11-30")
    assert out.settled_nanos <= limit
    assert team_line.spent_nanos == out.settled_nanos <= team_line.limit_nanos == limit
    assert team_line.reserved_nanos == 0  # every lease returned what it did not spend
    assert service.ledger.charged_nanos() == out.settled_nanos
    assert len(set(out.ok)) == len(out.ok)  # no request charged twice
    assert sum(r.requests for r in service.spend()) == len(out.ok)
    assert len(out.ok) >= 95, f"only {len(out.ok)} of the 100 affordable requests succeeded"
    assert len(out.ok) + len(out.over_budget) == 500
    refusal = out.over_budget[0]
    assert refusal.budget == "team:support:day:2026-11-30"
    assert refusal.limit_usd == nanos_to_usd(limit)
    assert refusal.resets_at == "2026-12-01T00:00:00+00:00"


@pytest.mark.parametrize("kind", ["direct", "leased"])
async def test_usage_above_and_below_the_estimate_and_failures(kind: str, ledger: BudgetLedger) -> None:
    ps, limit = budget_for(100)
    service = LedgerService(ledger)
    gates = make_gates(kind, ps, service, 3)
    waves = [
        await run_load(gates, [context(ps) for _ in range(50)], ps.providers, seed=i, usage_factor=0.5, fail_ratio=0.2)
        for i in range(3)
    ]
    await close(gates)
    settled = sum(w.settled_nanos for w in waves)
    assert service.ledger.charged_nanos() == settled
    # Cheaper calls and released failures leave room: more than 100 requests got through.
    assert sum(len(w.ok) + w.released for w in waves) > 100
    line = next(s for s in service.lines() if s.key.startswith("team:support:day"))
    assert line.reserved_nanos == 0 and line.spent_nanos == settled <= limit

    gates = make_gates(kind, ps, service, 3)
    dear = await run_load(gates, [context(ps) for _ in range(50)], ps.providers, usage_factor=1.5)
    await close(gates)
    line = next(s for s in service.lines() if s.key.startswith("team:support:day"))
    # Calls dearer than estimated still charge what they cost; then the budget refuses.
    assert line.spent_nanos == settled + dear.settled_nanos
    assert dear.over_budget, "the budget must refuse once exhausted"


async def test_the_next_day_has_a_fresh_budget(ledger: BudgetLedger) -> None:
    ps, _ = budget_for(10)
    service = LedgerService(ledger)
    gates = make_gates("leased", ps, service, 2)
    today = await run_load(gates, [context(ps) for _ in range(20)], ps.providers)
    tomorrow = await run_load(gates, [context(ps, at=NOON + 86_400) for _ in range(20)], ps.providers)
    await close(gates)
    assert len(today.ok) == 10 and len(tomorrow.ok) == 10
    assert tomorrow.over_budget[0].budget == "team:support:day:2026-12-01"


async def test_rate_limit_is_429_with_retry_after_and_shared_by_replicas(ledger: BudgetLedger) -> None:
    ps = with_limits(BASE, team_rate=RateLimit(requests_per_minute=30))
    service = LedgerService(ledger)
    for kind in ("direct", "leased"):
        service.buckets = type(service.buckets)()
        gates = make_gates(kind, ps, service, 3)
        out = await run_load(gates, [context(ps) for _ in range(60)], ps.providers)
        await close(gates)
        assert len(out.ok) <= 30 + 1, kind  # a burst of one minute's allowance, shared by all
        assert len(out.ok) >= 25, kind
        assert out.rate_limited and out.rate_limited[0].limit == "team:support:rpm"
        assert 0 < out.rate_limited[0].retry_after_s <= 60


async def test_a_replica_hands_money_between_its_own_leases(ledger: BudgetLedger) -> None:
    """Per-user budgets give each user a lease on the shared team line; money idle in one
    user's lease must not refuse another user while the team line still has it."""
    ps, limit = budget_for(4)
    service = LedgerService(ledger)
    admissions = Admissions(lambda: ps, per_user=BudgetLimits(day_usd=1.0))
    gate = LeasedBudgetGate(admissions, InProcessLedgerClient(service), "r", LeaseConfig(max_share=1.0))
    ok = 0
    for user in ("alice", "bob", "carol", "alice", "bob", "carol"):
        ctx = context(ps, user=user)
        est = await gate.estimate(ctx, "gpt-4o-mini", MESSAGES, 0)
        try:
            r = await gate.reserve(ctx, est)
        except OverBudget:
            continue
        await gate.settle(r, [Bill(est.model, Usage(est.input_tokens, est.max_output_tokens), usd_to_nanos(est.usd))])
        ok += 1
    await gate.aclose()
    assert ok == 4  # exactly the team's budget, although alice's first lease took all of it
    team = next(s for s in service.lines() if s.key.startswith("team:support:day"))
    assert team.spent_nanos == limit and team.reserved_nanos == 0


async def test_upkeep_sends_charges_and_returns_idle_and_prefetched_leases(ledger: BudgetLedger) -> None:
    ps, _ = budget_for(100)
    service = LedgerService(ledger)
    # Leases of 3 estimates; the second request leaves 1/3 and starts fetching the next lease.
    config = LeaseConfig(lease_requests=3, idle_close_s=0.0, flush_every_s=3600)
    gate = LeasedBudgetGate(Admissions(lambda: ps), InProcessLedgerClient(service), "r", config)
    for _ in range(2):
        ctx = context(ps)
        est = await gate.estimate(ctx, "gpt-4o-mini", MESSAGES, 0)
        held = await gate.reserve(ctx, est)
        await gate.settle(
            held, [Bill(est.model, Usage(est.input_tokens, est.max_output_tokens), usd_to_nanos(est.usd))]
        )
    await asyncio.sleep(0)  # let the prefetch run

    def team() -> tuple[int, int]:
        line = next(s for s in service.lines() if s.key.startswith("team:support:day"))
        return line.spent_nanos, line.reserved_nanos

    assert service.ledger.open_holds() == 2  # the current lease and the prefetched next one
    assert team()[0] == 0 and team()[1] == 6 * usd_to_nanos(est.usd)  # charges still queued
    await gate.maintain()
    assert team() == (2 * usd_to_nanos(est.usd), 0)
    assert service.ledger.open_holds() == 0
    await gate.aclose()
