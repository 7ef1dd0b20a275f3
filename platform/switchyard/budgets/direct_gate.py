"""The plain design: one shared-ledger round trip to admit a request and one to settle it.

Kept as the baseline the benchmark compares against, and for deployments with one replica
or a ledger in-process, where a round trip costs nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from switchyard.budgets.admission import Admission, Admissions, over_budget, permit_headroom, rate_limited
from switchyard.budgets.ledger import HoldRefused, HoldRequest
from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.ratelimit import PermitsRefused
from switchyard.budgets.service import LedgerClient
from switchyard.gateway.seams import Bill, CostEstimate, Headroom, RequestContext, Reservation

# A request hold outlives the flow's deadline by this much before the ledger may expire it.
HOLD_GRACE_S = 60.0


class DirectBudgetGate:
    """`BudgetGate` with a ledger round trip per reserve and per settle."""

    def __init__(self, admissions: Admissions, client: LedgerClient, holder: str) -> None:
        self.admissions = admissions
        self.client = client
        self.holder = holder
        self._open: dict[str, Admission] = {}
        self._headroom: dict[str, Headroom] = {}

    async def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, str]], max_tokens: int
    ) -> CostEstimate:
        return self.admissions.estimate(ctx, model, messages, max_tokens)

    async def reserve(self, ctx: RequestContext, estimate: CostEstimate) -> Reservation:
        a = self.admissions.admission(ctx, estimate)
        ttl = ctx.deadline_s + HOLD_GRACE_S
        hold = HoldRequest(a.reservation_id, self.holder, a.lines, a.amount_nanos, a.amount_nanos, ttl)
        result = await self.client.admit(a.permits, hold)
        if isinstance(result, PermitsRefused):
            raise rate_limited(result)
        if isinstance(result, HoldRefused):
            raise over_budget(result)
        self._open[a.reservation_id] = a
        room = None if result.hold is None else result.hold.headroom_nanos
        self._headroom[a.reservation_id] = permit_headroom(
            None if room is None else nanos_to_usd(room), a, result.permits_left
        )
        return Reservation(a.reservation_id, nanos_to_usd(a.amount_nanos), a.keys)

    async def settle(self, reservation: Reservation, bills: Sequence[Bill]) -> None:
        a = self._open[reservation.reservation_id]
        await self.client.settle(a.reservation_id, a.charges(bills), close=True)
        del self._open[reservation.reservation_id]  # only once recorded: a failed settle may be retried
        self._headroom.pop(reservation.reservation_id, None)

    def warnings(self, reservation: Reservation) -> list[str]:
        return []  # soft alerts are the leased gate's (the deployed one)

    def headroom(self, reservation: Reservation) -> Headroom:
        return self._headroom.get(reservation.reservation_id, Headroom())

    async def release(self, reservation: Reservation) -> None:
        self._open.pop(reservation.reservation_id, None)
        self._headroom.pop(reservation.reservation_id, None)
        await self.client.settle(reservation.reservation_id, [], close=True)
