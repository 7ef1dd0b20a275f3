"""Ledger operations per second, and the latency a budget gate adds per request, with the
leased design and the plain one-round-trip-per-request design side by side.

    flock /tmp/switchyard-ray.lock .venv/bin/python bench/budget_ledger.py [--requests 2000]

Optionally `eval "$(scripts/postgres.sh)"` first to include the Postgres store.
Every variant runs the same requests: reserve, (no provider call), settle; N concurrent
asyncio tasks over 2 gate instances (2 replicas) sharing one ledger.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from switchyard.budgets.admission import Admissions
from switchyard.budgets.direct_gate import DirectBudgetGate
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger, Charge, HoldRequest
from switchyard.budgets.money import usd_to_nanos
from switchyard.budgets.resolve import BudgetLine
from switchyard.budgets.service import InProcessLedgerClient, LedgerClient, LedgerService
from switchyard.db.engine import SQLITE_PREFIX, open_database
from switchyard.gateway.seams import Bill, BudgetGate, RequestContext, Usage
from switchyard.paths import repo_root
from switchyard.policy.layering import ResolvedFlow, resolve_flow
from switchyard.policy.models import DataPolicies, OrgPolicy, ProviderCatalog, RateLimit, TeamPolicy
from switchyard.policy.policy_set import PolicySet

MESSAGES = [{"role": "user", "content": "Where is my parcel? It was due on Monday."}]


def policy_set() -> PolicySet:
    """The shipped budget-relevant files, with support's rate limit lifted so nothing throttles."""
    root = repo_root() / "policies"

    def read(rel: str) -> Any:
        return yaml.safe_load((root / rel).read_text())

    teams = {p.stem: TeamPolicy.model_validate(read(f"teams/{p.name}")) for p in (root / "teams").glob("*.yaml")}
    teams["support"] = teams["support"].model_copy(
        update={"rate_limit": RateLimit(requests_per_minute=10**9, tokens_per_minute=10**12)}
    )
    return PolicySet(
        root,
        OrgPolicy.model_validate(read("org.yaml")),
        teams,
        ProviderCatalog.model_validate(read("providers.yaml")),
        DataPolicies.model_validate(read("data_policies.yaml")),
        {},
        {},
    )


def context(ps: PolicySet) -> RequestContext:
    resolved = resolve_flow(ps, "support", "reply")
    assert isinstance(resolved, ResolvedFlow)
    started = time.monotonic()
    return RequestContext(
        request_id=uuid.uuid4().hex,
        received_at=time.time(),
        started=started,
        team="support",
        key_id="k",
        user=None,
        flow=resolved.policy,
        requested_model="auto",
        prompt_ref="p@1#0",
        idempotency_key=None,
        deadline=started + 30,
        stream=False,
    )


def ledger_ops_per_s(url: str, n: int) -> float:
    """hold + settle pairs, sequential, straight on the store: 2 ledger operations each."""
    ledger = BudgetLedger(open_database(url))
    lines = (BudgetLine("org:bench:day:x", 10**15, "x"), BudgetLine("team:bench:day:x", 10**15, "x"))
    t0 = time.perf_counter()
    for _ in range(n):
        hid = uuid.uuid4().hex
        ledger.hold(HoldRequest(hid, "bench", lines, 100, 100, 60))
        ledger.settle(hid, [Charge(hid, "bench", "f", "m", None, "x", 100, 1, 1)], close=True)
    elapsed = time.perf_counter() - t0
    ledger.db.close()
    return 2 * n / elapsed


async def gate_run(gates: list[BudgetGate], ps: PolicySet, n: int, concurrency: int) -> dict[str, float]:
    """Time reserve + settle per request; contexts and estimates are built before the clock."""
    ctxs = [context(ps) for _ in range(n)]
    ests = [await gates[0].estimate(c, "gpt-4o-mini", MESSAGES, 0) for c in ctxs]
    latencies: list[float] = []
    sem = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        gate, est = gates[i % len(gates)], ests[i]
        async with sem:
            t0 = time.perf_counter()
            r = await gate.reserve(ctxs[i], est)
            await gate.settle(
                r, [Bill(est.model, Usage(est.input_tokens, est.max_output_tokens), usd_to_nanos(est.usd))]
            )
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    wall = time.perf_counter() - t0
    for g in gates:
        if isinstance(g, LeasedBudgetGate):
            await g.aclose()
    latencies.sort()
    return {
        "req_per_s": n / wall,
        "mean_us": statistics.fmean(latencies) * 1e6,
        "p50_us": latencies[len(latencies) // 2] * 1e6,
        "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6,
    }


def row(ledger: str, kind: str, conc: int, r: dict[str, float], extra: str = "") -> None:
    print(
        f"{ledger:<20}{kind:<8}{conc:>5}{r['req_per_s']:>10.0f}{r['mean_us']:>10.0f}"
        f"{r['p50_us']:>10.0f}{r['p99_us']:>10.0f}{extra}"
    )


def gates_for(kind: str, ps: PolicySet, client: LedgerClient) -> list[BudgetGate]:
    admissions = Admissions(lambda: ps)
    make: Callable[[str], BudgetGate] = (
        (lambda h: DirectBudgetGate(admissions, client, h))
        if kind == "plain"
        else (lambda h: LeasedBudgetGate(admissions, client, h))
    )
    return [make(f"replica-{i}") for i in range(2)]


async def ray_round_trip_us(actor: Any, n: int = 500) -> float:
    await actor.health.remote()
    t0 = time.perf_counter()
    for _ in range(n):
        await actor.health.remote()
    return (time.perf_counter() - t0) / n * 1e6


async def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--no-ray", action="store_true")
    args = parser.parse_args()
    ps = policy_set()
    tmp = Path(tempfile.mkdtemp(prefix="sybench-"))
    pg = os.environ.get("SWITCHYARD_TEST_POSTGRES_URL")

    print(
        f"# python {sys.version.split()[0]}, {os.cpu_count()} cpus; {args.requests} requests, "
        f"2 replicas (gate instances) sharing one ledger"
    )
    print("\n## ledger operations per second (hold or settle, sequential, on the store)")
    sqlite_ops = ledger_ops_per_s(SQLITE_PREFIX + str(tmp / "ops.db"), 1000)
    print(f"sqlite (WAL, synchronous=FULL): {sqlite_ops:8.0f} ops/s")
    if pg:
        BudgetLedger(open_database(pg)).db.close()  # creates the schema
        print(f"postgres (local, fsync=on):     {ledger_ops_per_s(pg, 1000):8.0f} ops/s")

    print("\n## added latency per request (reserve + settle), by design and ledger placement")
    print("   conc 1: what a lone request pays; conc N: throughput under load (latency = N / rate)")
    print(f"{'ledger':<20}{'design':<8}{'conc':>5}{'req/s':>10}{'mean us':>10}{'p50 us':>10}{'p99 us':>10}")
    for conc in (1, args.concurrency):
        n = args.requests if conc > 1 else args.requests // 4
        for kind in ("plain", "leased"):
            db = SQLITE_PREFIX + str(tmp / f"in-{kind}-{conc}.db")
            client = InProcessLedgerClient(LedgerService(BudgetLedger(open_database(db))))
            row("in-process sqlite", kind, conc, await gate_run(gates_for(kind, ps, client), ps, n, conc))
    if args.no_ray:
        return
    import ray

    from switchyard.cluster.ledger import ActorLedgerClient, ledger_actor

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(tmp / "ray"))
    try:
        for conc in (1, args.concurrency):
            n = args.requests if conc > 1 else args.requests // 4
            for kind in ("plain", "leased"):
                db = SQLITE_PREFIX + str(tmp / f"ray-{kind}-{conc}.db")
                actor = ledger_actor(db, name=f"bench-{kind}-{conc}", detached=False)
                rtt = await ray_round_trip_us(actor)
                r = await gate_run(gates_for(kind, ps, ActorLedgerClient(actor)), ps, n, conc)
                row("ray actor sqlite", kind, conc, r, f"   (bare actor round trip {rtt:.0f} us)")
                ray.kill(actor)
    finally:
        ray.shutdown()
    print(
        "\nreproduce: flock /tmp/switchyard-ray.lock .venv/bin/python bench/budget_ledger.py "
        f"--requests {args.requests} --concurrency {args.concurrency}"
    )


if __name__ == "__main__":
    asyncio.run(main())
