"""The shared ledger service: budget holds, charges and rate-limit buckets behind one API.

`switchyard.cluster.ledger` hosts one `LedgerService` in a Ray named actor so every gateway
replica shares it; tests and benchmarks use it in-process through `InProcessLedgerClient`.
`admit` takes the rate-limit permits and the budget hold in one call, so the plain design
costs one round trip to admit and one to settle.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from switchyard.budgets.ledger import (
    BudgetLedger,
    Charge,
    HoldGranted,
    HoldRefused,
    HoldRequest,
    LineStatus,
    SoftAlert,
    SpendRow,
)
from switchyard.budgets.ratelimit import PermitDemand, PermitsGranted, PermitsRefused, TokenBuckets
from switchyard.db.engine import database_errors
from switchyard.gateway.seams import BudgetUnavailable

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admitted:
    permits: dict[str, int]
    hold: HoldGranted | None
    permits_left: dict[str, int] = field(default_factory=dict)  # in the shared buckets, after this take


Admission = Admitted | PermitsRefused | HoldRefused


class LedgerService:
    def __init__(
        self,
        ledger: BudgetLedger,
        clock: Callable[[], float] = time.time,
        expire_every_s: float = 1.0,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`clock`: the wall clock (rate buckets). `timer`, monotonic: when expiry last ran, and
        when each holder was last heard from in this process (see `expire_due`)."""
        self.ledger = ledger
        self.buckets = TokenBuckets()
        self._clock = clock
        self._timer = timer
        self._expire_every_s = expire_every_s
        self._last_expiry: float | None = None
        self._heard_until: dict[str, float] = {}  # holder -> timer reading its last hold or renewal lasts to

    def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission:
        """Rate-limit permits and a budget hold, all or nothing."""
        self.expire_due()
        now = self._clock()
        taken = self.buckets.take(permits, now)
        if isinstance(taken, PermitsRefused):
            return taken
        if hold is None:
            return Admitted(taken.granted, None, taken.left)
        self._heard_from(hold.holder, hold.ttl_s)
        held = self.ledger.hold(hold)
        if isinstance(held, HoldRefused):
            self.give_back(taken.granted, {d.key: d.per_minute for d in permits})
            return held
        return Admitted(taken.granted, held, taken.left)

    def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        alerts = self.ledger.settle(hold_id, charges, close, keep_nanos)
        for a in alerts:
            log.warning("budget %s passed %.0f%% of its limit", a.key, a.threshold * 100)
        return alerts

    def give_back(self, returned: dict[str, int], limits: dict[str, int]) -> None:
        self.buckets.give_back(returned, limits, self._clock())

    def renew(self, holder: str, ttl_s: float) -> int:
        self.expire_due()
        self._heard_from(holder, ttl_s)
        return self.ledger.renew(holder, ttl_s)

    def _heard_from(self, holder: str, ttl_s: float) -> None:
        self._heard_until[holder] = self._timer() + ttl_s

    def expire_due(self) -> list[str]:
        """Release the holds whose expiry (on the wall clock, stored with them) has passed,
        except those of a holder this process heard from within its TTL on the monotonic timer:
        a wall clock stepped forward past the TTL (NTP, a resumed VM) would otherwise expire
        every live replica's holds at once and hand their money to others while they spend it.
        A restarted ledger has heard from no one yet, and goes by the stored expiry."""
        now = self._timer()
        if self._last_expiry is not None and now - self._last_expiry < self._expire_every_s:
            return []
        self._last_expiry = now
        return self.expire_now()

    def expire_now(self) -> list[str]:
        """`expire_due` without its pacing."""
        now = self._timer()
        self._heard_until = {h: until for h, until in self._heard_until.items() if until > now}
        return self.ledger.expire(spare=self._heard_until.__contains__)

    def lines(self, key_prefixes: Sequence[str] | None = None) -> list[LineStatus]:
        return self.ledger.lines(key_prefixes)

    def spend(self, team: str | None = None, since_day: str | None = None) -> list[SpendRow]:
        return self.ledger.spend(team, since_day)

    def charges_of(self, request_ids: Sequence[str]) -> dict[str, list[Charge]]:
        return self.ledger.charges_of(request_ids)


class LedgerClient(Protocol):
    """How a gate reaches the shared ledger: in-process, or a Ray actor handle."""

    async def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission: ...

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]: ...

    async def give_back(self, returned: dict[str, int], limits: dict[str, int]) -> None: ...

    async def renew(self, holder: str, ttl_s: float) -> int: ...


class InProcessLedgerClient:
    """Calls a `LedgerService` in this process (tests, benchmarks, a single-process gateway)."""

    def __init__(self, service: LedgerService) -> None:
        self.service = service

    async def admit(self, permits: tuple[PermitDemand, ...], hold: HoldRequest | None) -> Admission:
        try:
            return self.service.admit(permits, hold)
        except database_errors(OSError) as exc:  # the ledger's database: locked, gone, full
            raise BudgetUnavailable(f"the ledger's database is unavailable ({type(exc).__name__})") from exc

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        return self.service.settle(hold_id, charges, close, keep_nanos)

    async def give_back(self, returned: dict[str, int], limits: dict[str, int]) -> None:
        self.service.give_back(returned, limits)

    async def renew(self, holder: str, ttl_s: float) -> int:
        return self.service.renew(holder, ttl_s)


__all__ = [
    "Admission",
    "Admitted",
    "InProcessLedgerClient",
    "LedgerClient",
    "LedgerService",
    "PermitsGranted",
    "PermitsRefused",
]
