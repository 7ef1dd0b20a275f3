"""A concurrency harness: N asyncio tasks through several gates that share one ledger, as
gateway replicas would, against a fake upstream that reports usage equal to the estimate."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from switchyard.budgets.periods import utc
from switchyard.budgets.pricing import usage_cost_nanos
from switchyard.gateway.seams import Bill, BudgetGate, OverBudget, RateLimited, RequestContext, Usage
from switchyard.policy.models import ProviderCatalog

MESSAGES = [{"role": "user", "content": "Where is my parcel? It was due on Monday."}]


@dataclass
class Outcome:
    ok: list[str] = field(default_factory=list)  # reservation ids settled
    settled_nanos: int = 0
    over_budget: list[OverBudget] = field(default_factory=list)
    rate_limited: list[RateLimited] = field(default_factory=list)
    released: int = 0


async def one_request(
    gate: BudgetGate,
    ctx: RequestContext,
    catalog: ProviderCatalog,
    out: Outcome,
    *,
    fail_ratio: float = 0.0,
    usage_factor: float = 1.0,
    latency_s: float = 0.005,
    rng: random.Random,
) -> None:
    model = ctx.flow.model
    est = await gate.estimate(ctx, model, MESSAGES, 0)
    try:
        reservation = await gate.reserve(ctx, est)
    except OverBudget as exc:
        out.over_budget.append(exc)
        return
    except RateLimited as exc:
        out.rate_limited.append(exc)
        return
    await asyncio.sleep(rng.uniform(0, latency_s))  # the provider call
    if rng.random() < fail_ratio:
        await gate.release(reservation)
        out.released += 1
        return
    usage = Usage(round(est.input_tokens * usage_factor), round(est.max_output_tokens * usage_factor))
    nanos = usage_cost_nanos(catalog, model, usage, utc(ctx.received_at).date())
    await gate.settle(reservation, [Bill(model, usage, nanos)])
    out.ok.append(reservation.reservation_id)
    out.settled_nanos += nanos


async def run_load(
    gates: Sequence[BudgetGate],
    contexts: Sequence[RequestContext],
    catalog: ProviderCatalog,
    seed: int = 7,
    **kw: float,
) -> Outcome:
    out = Outcome()
    rng = random.Random(seed)
    await asyncio.gather(
        *(one_request(gates[i % len(gates)], ctx, catalog, out, rng=rng, **kw) for i, ctx in enumerate(contexts))
    )
    return out
