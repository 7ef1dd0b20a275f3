"""What a response says is left (`x-switchyard-budget-remaining-usd`, OpenAI's
`x-ratelimit-remaining-requests` / `-tokens`) comes from the ledger's own answers: the hold's
headroom and the shared buckets' level, plus what this replica still holds locally."""

from __future__ import annotations

import pytest
from _budget_helpers import NOON, FixedClock, context, shipped, with_limits

from switchyard.budgets.admission import Admissions
from switchyard.budgets.direct_gate import DirectBudgetGate
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import Database
from switchyard.gateway.results import budget_left
from switchyard.gateway.seams import Bill, Usage
from switchyard.policy.models import BudgetLimits, RateLimit

pytestmark = pytest.mark.asyncio(loop_scope="session")
CHARGE_NANOS = 100_000  # $0.0001 per request


@pytest.mark.parametrize("design", ["leased", "direct"])
async def test_budget_and_rate_limits_left_fall_as_requests_are_charged(ledger_db: Database, design: str) -> None:
    limits = BudgetLimits(day_usd=0.01)
    rate = RateLimit(requests_per_minute=50, tokens_per_minute=100_000)
    ps = with_limits(shipped(), team="support", team_rate=rate, flow_budget=("reply", limits))
    clock = FixedClock(NOON)
    service = LedgerService(BudgetLedger(ledger_db, clock), clock)
    client = InProcessLedgerClient(service)
    admissions = Admissions(lambda: ps, clock=clock)
    gate = (
        LeasedBudgetGate(admissions, client, "r", LeaseConfig(max_share=1.0), timer=clock)
        if design == "leased"
        else DirectBudgetGate(admissions, client, "r")
    )
    lefts, requests, tokens = [], [], []
    for _ in range(5):
        ctx = context(ps, team="support", flow="reply", at=clock.now)
        estimate = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "hi"}], 16)
        reservation = await gate.reserve(ctx, estimate)
        room = gate.headroom(reservation)
        left = budget_left(room, reservation, nanos_to_usd(CHARGE_NANOS))
        assert left is not None and room.requests is not None and room.tokens is not None, (design, room)
        lefts.append(left)
        requests.append(room.requests)
        tokens.append(room.tokens)
        await gate.settle(reservation, [Bill("gpt-4o-mini", Usage(1, 1), CHARGE_NANOS)])
        if design == "leased":
            await gate.maintain()
    if design == "leased":
        await gate.aclose()
    # The team's flow budget is $0.01 and each request is charged $0.0001: what is left after
    # the i-th request is exactly $0.01 - i x $0.0001, whatever the lease holds.
    assert lefts == pytest.approx([0.01 - (i + 1) * 0.0001 for i in range(5)], abs=1e-9), (design, lefts)
    # One request permit per request: the shared bucket plus local stock falls by one each time.
    assert requests == [49 - i for i in range(5)], (design, requests)
    assert tokens == sorted(tokens, reverse=True) and tokens[0] < 100_000
