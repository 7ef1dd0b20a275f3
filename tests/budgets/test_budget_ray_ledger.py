"""The ledger as a Ray named actor: replicas share it, and killing it mid-load loses and
double-counts nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from _budget_helpers import context, shipped, with_limits
from _load import Outcome, run_load

from switchyard.budgets.admission import Admissions
from switchyard.budgets.direct_gate import DirectBudgetGate
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate
from switchyard.db.engine import SQLITE_PREFIX
from switchyard.gateway.seams import BudgetGate
from switchyard.policy.models import BudgetLimits, RateLimit

pytestmark = [pytest.mark.ray]

PS = with_limits(
    shipped(),
    team_budget=BudgetLimits(day_usd=100),
    team_rate=RateLimit(requests_per_minute=100_000, tokens_per_minute=10**9),
)


@pytest.mark.parametrize("kind", ["direct", "leased"])
async def test_killing_the_ledger_actor_mid_load_loses_and_double_counts_nothing(
    kind: str, tmp_path: Path, ray_session: None
) -> None:
    import ray

    from switchyard.cluster.ledger import ActorLedgerClient, ledger_actor

    name = f"ledger-kill-{kind}"
    actor = ledger_actor(SQLITE_PREFIX + str(tmp_path / "ledger.db"), name=name, detached=False)
    client = ActorLedgerClient(actor)
    admissions = Admissions(lambda: PS)
    config = LeaseConfig(flush_every_s=0.05, lease_requests=8)
    gates: list[BudgetGate] = [
        DirectBudgetGate(admissions, client, f"r{i}")
        if kind == "direct"
        else LeasedBudgetGate(admissions, client, f"r{i}", config)
        for i in range(2)
    ]
    waves: list[Outcome] = []

    async def load() -> None:
        for seed in range(8):
            waves.append(
                await run_load(gates, [context(PS) for _ in range(40)], PS.providers, seed=seed, latency_s=0.03)
            )

    first_pid = (await actor.health.remote())["pid"]
    loading = asyncio.create_task(load())
    while len(waves) < 3 and not loading.done():
        await asyncio.sleep(0.01)
    ray.kill(actor, no_restart=False)  # the actor dies mid-load and Ray restarts it
    await loading
    assert (await actor.health.remote())["pid"] != first_pid, "the actor was not restarted"
    for g in gates:
        if isinstance(g, LeasedBudgetGate):
            await g.aclose()

    settled = sum(w.settled_nanos for w in waves)
    assert sum(len(w.ok) for w in waves) == 320  # the budget covers all; none may be lost
    assert await actor.charged_nanos.remote() == settled
    lines = {s.key: s for s in await actor.lines.remote()}
    team = lines["team:support:day:2026-11-30"]
    assert team.spent_nanos == settled and team.reserved_nanos == 0
    rows = await actor.spend.remote(team="support")
    assert sum(r.requests for r in rows) == 320
    ray.kill(actor, no_restart=True)


async def test_replicas_share_the_actor_and_a_dead_replicas_lease_expires(tmp_path: Path, ray_session: None) -> None:
    import ray

    from switchyard.cluster.ledger import ActorLedgerClient, ledger_actor

    actor = ledger_actor(SQLITE_PREFIX + str(tmp_path / "ledger.db"), name="ledger-expiry", detached=False)
    same = ledger_actor(SQLITE_PREFIX + str(tmp_path / "other.db"), name="ledger-expiry", detached=False)
    client = ActorLedgerClient(same)  # found by name: the second URL is ignored
    admissions = Admissions(lambda: PS)
    dying = LeasedBudgetGate(admissions, client, "dying", LeaseConfig(ttl_s=0.5))
    await dying.reserve(context(PS), admissions.estimate(context(PS), "gpt-4o-mini", [], 0))
    dying._maintainer.cancel()  # type: ignore[union-attr]  # the replica dies: no renewals, no close
    team = "team:support:day:2026-11-30"
    held = {s.key: s for s in await actor.lines.remote()}[team].reserved_nanos
    assert held > 0
    await asyncio.sleep(1.2)
    assert len(await actor.expire.remote()) == 1
    assert {s.key: s for s in await actor.lines.remote()}[team].reserved_nanos == 0
    ray.kill(actor, no_restart=True)
