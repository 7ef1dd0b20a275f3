"""End to end through the gateway's HTTP app: 500 concurrent requests over four gateway
instances (as four replicas) whose budget gates share one ledger; the team's budget covers
exactly 100 requests at the estimate and the fake upstream reports usage equal to it."""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml
from _budget_helpers import REPO

from switchyard.budgets.admission import Admissions
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger, LineStatus
from switchyard.budgets.service import InProcessLedgerClient, LedgerClient, LedgerService
from switchyard.budgets.tokens import count_input_tokens
from switchyard.db.engine import SQLITE_PREFIX, SqliteDatabase
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.interim import CollectingAuditSink, PassthroughRedactor
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import Completion, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.seams import Usage
from switchyard.policy.keys import KeyStore
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import BudgetLimits, Role
from switchyard.policy.policy_set import PolicySet

TEAM = {
    "team": "spendtest",
    "default_flow": "chat",
    "allowed_providers": ["openai"],
    "rate_limit": {"requests_per_minute": 100000, "tokens_per_minute": 1000000000},
    "flows": {"chat": {"prompt": "assistant@1", "model": "gpt-4o-mini", "max_tokens": 64}},
}
BODY = {"model": "auto", "messages": [{"role": "user", "content": "Summarise my order status, please."}]}


@dataclass
class SharedLedger:
    """The ledger the four replicas share, and how the test reads it afterwards."""

    client: LedgerClient
    lines: Callable[[], Awaitable[list[LineStatus]]]
    charged: Callable[[], Awaitable[int]]


def shared_ledger(kind: str, tmp: Path, request: pytest.FixtureRequest) -> SharedLedger:
    if kind == "in-process":
        service = LedgerService(BudgetLedger(SqliteDatabase(tmp / "ledger.db")))

        async def lines() -> list[LineStatus]:
            return service.lines()

        async def charged() -> int:
            return service.ledger.charged_nanos()

        return SharedLedger(InProcessLedgerClient(service), lines, charged)
    request.getfixturevalue("ray_session")  # before importing ray: it sets Ray's environment
    import ray

    from switchyard.cluster.ledger import ActorLedgerClient, ledger_actor

    actor = ledger_actor(SQLITE_PREFIX + str(tmp / "ledger.db"), name="ledger-e2e", detached=False)
    request.addfinalizer(lambda: ray.kill(actor, no_restart=True))

    async def actor_lines() -> list[LineStatus]:
        result: list[LineStatus] = await actor.lines.remote()
        return result

    async def actor_charged() -> int:
        result: int = await actor.charged_nanos.remote()
        return result

    return SharedLedger(ActorLedgerClient(actor), actor_lines, actor_charged)


async def usage_equal_to_estimate(call: ProviderCall) -> Completion:
    await asyncio.sleep(0.002)
    usage = Usage(count_input_tokens("o200k", call.messages), call.max_tokens)
    return Completion("ok", usage, "stop", call.model_version)


def policies(tmp: Path) -> PolicySet:
    root = tmp / "policies"
    shutil.copytree(REPO / "policies", root)
    if not (root / "scheduler.yaml").exists():
        (root / "scheduler.yaml").write_text("")  # another area's file; empty means defaults
    (root / "teams" / "spendtest.yaml").write_text(yaml.safe_dump(TEAM))
    return load_policy_set(root)


def replica(
    ps: PolicySet, keys: KeyStore, client: LedgerClient, name: str
) -> tuple[httpx.AsyncClient, LeasedBudgetGate]:
    gate = LeasedBudgetGate(Admissions(lambda: ps), client, name)
    metrics = InMemoryMetrics()
    parts = GatewayParts(
        policies=lambda: ps,
        keys=KeySnapshot(keys.verifier(), keys.version()),
        providers=ProviderPool(overrides={"openai": InProcessProvider("openai", usage_equal_to_estimate)}),
        budget=gate,
        redactor=PassthroughRedactor(ps),
        audit=CollectingAuditSink(),
        metrics=metrics,
        idempotency=InMemoryIdempotencyStore(),
        circuits=CircuitBoard(on_change=metrics.circuit_changed),
    )
    pipeline = ChatPipeline(parts)
    app = create_app(lambda: pipeline)
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw"), gate


@pytest.mark.parametrize("ledger", ["in-process", pytest.param("ray-actor", marks=pytest.mark.ray)])
async def test_500_concurrent_requests_through_the_gateway(
    ledger: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    base = policies(tmp_path)
    keys = KeyStore.in_state_dir(tmp_path)
    key = keys.create("spendtest", Role.MEMBER)[0]
    headers = {"authorization": f"Bearer {key}"}

    # A probe learns what one request costs (usage equals the estimate, so the charge is it).
    probe = LedgerService(BudgetLedger(SqliteDatabase(tmp_path / "probe.db")))
    client, gate = replica(base, keys, InProcessLedgerClient(probe), "probe")
    assert (await client.post("/v1/chat/completions", json=BODY, headers=headers)).status_code == 200
    await gate.aclose()
    await client.aclose()
    one = probe.ledger.charged_nanos()
    assert one > 0

    limit = 100 * one
    team = base.teams["spendtest"].model_copy(update={"budget": BudgetLimits(day_usd=limit / 1e9)})
    ps = PolicySet(
        base.root,
        base.org,
        {**base.teams, "spendtest": team},
        base.providers,
        base.data,
        base.prompts,
        base.scheduler,
        base.file_hashes,
    )
    reader = shared_ledger(ledger, tmp_path, request)
    replicas = [replica(ps, keys, reader.client, f"replica-{i}") for i in range(4)]
    responses = await asyncio.gather(
        *(replicas[i % 4][0].post("/v1/chat/completions", json=BODY, headers=headers) for i in range(500))
    )
    for client, gate in replicas:
        await gate.aclose()
        await client.aclose()

    codes = Counter(r.status_code for r in responses)
    assert set(codes) <= {200, 402}, codes
    assert codes[200] >= 95, codes
    team_line = next(s for s in await reader.lines() if s.key.startswith("team:spendtest:day:"))
    assert team_line.spent_nanos == await reader.charged() == codes[200] * one <= limit
    assert team_line.reserved_nanos == 0
    refused = next(r for r in responses if r.status_code == 402).json()["error"]["message"]
    assert team_line.key in refused and "resets at" in refused
