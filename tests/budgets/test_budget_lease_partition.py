"""A replica cut off from the ledger (issue "money and audit", finding 5).

Replica A holds a lease, then loses the ledger. The ledger, seeing no renewals, expires A's
hold after its TTL and hands the money to replica B. Had A kept reserving from its lease
meanwhile, its charges would arrive when the partition heals, on top of B's: the team's day
limit overspent. A replica therefore stops reserving from a lease not renewed for
`renew_cutoff_s`, and the shipped settings make every hold outlive the requests that
reserved from it (`check_lease_bound`). Clocks are injected: no test waits for a TTL."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from _budget_helpers import NOON, FixedClock, context, shipped, with_limits

from switchyard.budgets.admission import Admissions
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate, check_lease_bound
from switchyard.budgets.ledger import BudgetLedger, Charge, HoldRequest, SoftAlert
from switchyard.budgets.ratelimit import PermitDemand
from switchyard.budgets.service import Admission, InProcessLedgerClient, LedgerService
from switchyard.db.engine import Database
from switchyard.gateway.seams import Bill, OverBudget, RateLimited, Usage
from switchyard.policy.models import MAX_DEADLINE_MS, BudgetLimits, RateLimit

pytestmark = pytest.mark.asyncio(loop_scope="session")

LIMIT_USD = 0.05


class Partitioned(Exception):
    """What a replica cut off from the ledger gets from every call."""


class PartitionableClient(InProcessLedgerClient):
    def __init__(self, service: LedgerService) -> None:
        super().__init__(service)
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise Partitioned("the ledger is unreachable from this replica")

    async def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission:
        self._check()
        return await super().admit(permits, hold)

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        self._check()
        return await super().settle(hold_id, charges, close, keep_nanos)

    async def renew(self, holder: str, ttl_s: float) -> int:
        self._check()
        return await super().renew(holder, ttl_s)


async def _spend(gate: LeasedBudgetGate, ps: object, clock: FixedClock, n: int) -> int:
    """Reserve and settle up to `n` requests; how many were answered before a refusal."""
    done = 0
    for _ in range(n):
        ctx = context(ps, team="support", flow="reply", at=clock.now)  # type: ignore[arg-type]
        estimate = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "hi"}], 64)
        try:
            reservation = await gate.reserve(ctx, estimate)
        except RateLimited as limited:
            clock.now += limited.retry_after_s  # the team's rate limit refills; money is the point here
            continue
        except (OverBudget, Partitioned):
            return done
        usage = Usage(estimate.input_tokens, estimate.max_output_tokens)
        nanos = round(estimate.usd * 1e9)
        await gate.settle(reservation, [Bill("gpt-4o-mini", usage, nanos)])
        done += 1
    return done


class ReplicaClock(FixedClock):
    """Replica A's wall clock: the ledger's, until an NTP step or a resumed VM moves it."""

    def __init__(self, ledger: FixedClock) -> None:
        super().__init__()
        self.ledger, self.step_s = ledger, 0.0

    def __call__(self) -> float:
        return self.ledger.now + self.step_s


# A's monotonic timer is the ledger's clock, which never steps. A's wall clock stepping
# back an hour as it is cut off (stop 47): the lease's age was measured on the wall clock, so
# it looked renewed for another hour and A went on spending what the ledger gave B.
@pytest.mark.parametrize("wall_step_s", [0.0, -3_600.0], ids=["steady", "wall-clock-steps-back"])
async def test_a_partitioned_replica_stops_spending_before_its_hold_can_expire(
    ledger_db: Database, wall_step_s: float
) -> None:
    # No rate limit: its permits would need the ledger too, and money is the point here.
    ps = with_limits(
        shipped(), team="support", team_rate=RateLimit(), flow_budget=("reply", BudgetLimits(day_usd=LIMIT_USD))
    )
    clock = FixedClock(NOON)
    a_wall = ReplicaClock(clock)
    service = LedgerService(BudgetLedger(ledger_db, clock), clock)
    config = LeaseConfig()
    a_client, b_client = PartitionableClient(service), PartitionableClient(service)
    a = LeasedBudgetGate(Admissions(lambda: ps, clock=a_wall), a_client, "replica-a", config, timer=clock)
    b = LeasedBudgetGate(Admissions(lambda: ps, clock=clock), b_client, "replica-b", config, timer=clock)

    assert await _spend(a, ps, clock, 3) == 3  # A takes a lease
    await a.maintain()  # its charges reach the ledger; the lease is renewed
    a_client.cut = True
    a_wall.step_s = wall_step_s
    clock.now += config.renew_cutoff_s + 1
    cut_off_spent = await _spend(a, ps, clock, 10_000)  # A, cut off, tries to go on spending its lease
    clock.now += config.ttl_s + 1
    service.expire_due()  # no renewals from A: its hold expires and its money returns
    await _spend(b, ps, clock, 10_000)  # B spends the budget to its limit
    await b.aclose()
    a_client.cut = False
    await a.aclose()  # the partition heals: whatever A charged meanwhile arrives now

    line = next(s for s in service.lines() if s.key.startswith("flow:support/reply:day:"))
    limit = round(LIMIT_USD * 1e9)
    assert cut_off_spent == 0, f"a replica cut off from the ledger answered {cut_off_spent} more requests"
    assert line.spent_nanos <= limit, f"spent {line.spent_nanos / limit:.2f}x the day limit"


async def test_the_lease_settings_outlive_the_longest_request_any_policy_set_allows() -> None:
    """Against the ceiling the policy loader enforces, not the flows loaded at start: a set
    reloaded later cannot lengthen a request past what a hold outlives."""
    longest = MAX_DEADLINE_MS / 1000
    check_lease_bound(LeaseConfig(), longest)
    with pytest.raises(ValueError, match="ttl_s=30 must be at least"):
        check_lease_bound(LeaseConfig(ttl_s=30), longest)


async def test_a_ledger_clock_stepped_forward_expires_no_live_replicas_hold(ledger_db: Database) -> None:
    """The ledger's wall clock jumps an hour ahead (an NTP step, its VM resumed): every stored
    hold expiry is in the past at once. Before stop 47 the ledger released every live
    replica's holds and gave their money to others while the replicas went on spending their
    leases. Now it keeps the holds of replicas it heard from within their TTL (monotonic)."""
    ps = with_limits(
        shipped(), team="support", team_rate=RateLimit(), flow_budget=("reply", BudgetLimits(day_usd=LIMIT_USD))
    )
    clock = FixedClock(NOON)  # the replicas' clocks, and the ledger's monotonic timer
    ledger_wall = ReplicaClock(clock)
    service = LedgerService(BudgetLedger(ledger_db, ledger_wall), ledger_wall, timer=clock)
    config = LeaseConfig()
    a = LeasedBudgetGate(Admissions(lambda: ps, clock=clock), InProcessLedgerClient(service), "a", config, timer=clock)
    b = LeasedBudgetGate(Admissions(lambda: ps, clock=clock), InProcessLedgerClient(service), "b", config, timer=clock)

    assert await _spend(a, ps, clock, 3) == 3  # A takes a lease
    await a.maintain()
    ledger_wall.step_s = 3_600.0
    clock.now += 2
    assert service.expire_due() == [], "a live replica's hold was expired by a step of the ledger's clock"
    await _spend(b, ps, clock, 10_000)  # B spends what is left
    await _spend(a, ps, clock, 10_000)  # A goes on spending its lease
    await a.aclose()
    await b.aclose()

    line = next(s for s in service.lines() if s.key.startswith("flow:support/reply:day:"))
    limit = round(LIMIT_USD * 1e9)
    assert line.spent_nanos <= limit, f"spent {line.spent_nanos / limit:.2f}x the day limit"

    # A replica that stops renewing still loses its holds, after their TTL on the timer.
    c = LeasedBudgetGate(Admissions(lambda: ps, clock=clock), InProcessLedgerClient(service), "c", config, timer=clock)
    clock.now += 86_400  # the next day: a fresh budget
    assert await _spend(c, ps, clock, 1) == 1 and service.ledger.open_holds() == 1
    clock.now += config.ttl_s + 1
    service.expire_due()
    assert service.ledger.open_holds() == 0
