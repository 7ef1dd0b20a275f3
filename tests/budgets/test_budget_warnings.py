"""A budget line that passes a soft-alert threshold (`budget.soft_alerts`, 80% by default)
is named in the `x-switchyard-budget-warning` header of the team's later answers, so the
team's own code and its admins see it before the 402s start."""

from __future__ import annotations

import pytest
from _budget_helpers import NOON, FixedClock, context, shipped, with_limits

from switchyard.budgets.admission import Admissions
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import Database
from switchyard.gateway.seams import Bill, Usage
from switchyard.policy.models import BudgetLimits, RateLimit

pytestmark = pytest.mark.asyncio(loop_scope="session")


async def test_passing_a_soft_threshold_warns_on_later_answers(ledger_db: Database) -> None:
    limits = BudgetLimits(day_usd=0.001, soft_alerts=(0.5, 0.8))
    ps = with_limits(shipped(), team="support", team_rate=RateLimit(), flow_budget=("reply", limits))
    clock = FixedClock(NOON)
    service = LedgerService(BudgetLedger(ledger_db, clock))
    gate = LeasedBudgetGate(
        Admissions(lambda: ps, clock=clock), InProcessLedgerClient(service), "r", LeaseConfig(), timer=clock
    )
    warned: list[list[str]] = []
    for _ in range(9):  # each charge is a tenth of the day's limit
        ctx = context(ps, team="support", flow="reply", at=clock.now)
        estimate = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "hi"}], 16)
        reservation = await gate.reserve(ctx, estimate)
        warned.append(gate.warnings(reservation))
        await gate.settle(reservation, [Bill("gpt-4o-mini", Usage(1, 1), 100_000)])
        await gate.maintain()  # the charges reach the ledger, which raises the alert once
    await gate.aclose()
    assert warned[0] == [] and warned[4] == []
    assert any("passed 50%" in w for w in warned[6]) and any("passed 80%" in w for w in warned[-1]), warned
    assert all(w.startswith("flow:support/reply:day:") for w in warned[-1])
