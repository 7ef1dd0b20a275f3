"""The chosen design: each replica leases a slice of a budget and spends it locally.

A lease is a ledger hold worth several requests' estimates on one set of budget lines (one
team, flow, user and period). Requests reserve from it in-process, with no round trip; their
charges are sent to the ledger in batches. The guarantee is the plain design's: money a
request may spend is always held in the shared ledger before the provider is called, because
a request only proceeds against lease money the ledger already granted.

With a `ChargeJournal`, each reservation and each charge is journaled before the provider is
called and before the response returns, so a replica killed before its next flush loses no
charge, and a request it was still serving is charged its whole reservation: the next gate
on the host sends them (`recover`). A lease that cannot fit the next request is retired: it
returns at once everything except what its in-flight requests still hold, and closes when
the last of them settles. A replica renews its leases while alive; a dead replica's leases
expire and their unused money returns.
Rate-limit permits are leased the same way, a fraction of a second's worth at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from switchyard.budgets.admission import Admission, Admissions, over_budget, permit_headroom, rate_limited
from switchyard.budgets.charge_journal import ChargeJournal, RecoveryReport, recover_orphans
from switchyard.budgets.ledger import Charge, HoldRefused, HoldRequest, SoftAlert
from switchyard.budgets.money import nanos_to_usd
from switchyard.budgets.ratelimit import PermitDemand, PermitsRefused
from switchyard.budgets.resolve import BudgetLine
from switchyard.budgets.service import Admitted, LedgerClient
from switchyard.gateway.seams import Bill, CostEstimate, Headroom, RequestContext, Reservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LeaseConfig:
    lease_requests: int = 32
    """A lease asks for this many times the estimate of the request that opened it."""
    max_share: float = 0.25
    """...but never more than this fraction of the smallest remaining headroom, so replicas
    leave money for each other as a budget runs low."""
    ttl_s: float = 150.0
    """A lease not renewed for this long is expired by the ledger (its replica died). It must
    outlive every request that reserved from the lease (`check_lease_bound`)."""
    renew_cutoff_s: float = 10.0
    """A replica stops reserving from a lease whose last successful renewal is older than this
    (it may be cut off from the ledger, which will soon expire the hold and re-grant it)."""
    clock_skew_s: float = 5.0
    """Allowance for the ledger's clock running ahead of the replica's."""
    flush_every_s: float = 0.25
    """Charges reach the ledger at most this late (also the renewal interval)."""
    flush_batch: int = 64
    prefetch_below: float = 0.5
    """Fetch the next lease in the background once the current one is below this fraction."""
    idle_close_s: float = 2.0
    """A lease unused for this long is closed and its money returned."""
    journal_compact_bytes: int = 4 << 20
    """A journal larger than this is rewritten with only what it still covers (upkeep)."""
    permit_batch_s: float = 0.25
    """Rate-limit permits held locally: this many seconds of the limit's refill."""


def check_lease_bound(config: LeaseConfig, longest_request_s: float) -> None:
    """Refuse settings under which a hold could expire while a request that reserved from it
    still runs (docs/budgets.md, "Leases and partitions"): the ledger would hand that money to
    another replica and the late charge would overspend the budget."""
    needed = config.renew_cutoff_s + longest_request_s + config.flush_every_s + config.clock_skew_s
    if config.ttl_s < needed:
        raise ValueError(
            f"lease ttl_s={config.ttl_s:g} must be at least renew_cutoff_s ({config.renew_cutoff_s:g}) + the longest"
            f" flow deadline ({longest_request_s:g}) + flush_every_s ({config.flush_every_s:g}) + clock_skew_s"
            f" ({config.clock_skew_s:g}) = {needed:g}"
        )


@dataclass
class _Lease:
    hold_id: str
    lines: tuple[BudgetLine, ...]
    granted: int
    last_used: float
    renewed_at: float  # when the ledger last confirmed the hold (granted or renewed)
    headroom: int | None = None  # left unheld on the tightest line when the hold was granted
    used: int = 0  # in-flight estimates plus charges
    in_flight: dict[str, int] = field(default_factory=dict)  # reservation id -> amount
    pending: list[Charge] = field(default_factory=list)
    retired: bool = False
    # Flushes of one lease go in order: a trim computed before an earlier batch of charges
    # reached the ledger would return money that in-flight requests still need.
    flush_lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def available(self) -> int:
        return self.granted - self.used


@dataclass
class _Permits:
    per_minute: int
    count: int  # held here, not yet used
    taken_at: float
    shared_left: int = 0  # left in the shared bucket at the last take


class LeasedBudgetGate:
    """`BudgetGate` that spends leased budget slices locally (see the module docstring)."""

    def __init__(
        self,
        admissions: Admissions,
        client: LedgerClient,
        holder: str,
        config: LeaseConfig | None = None,
        journal: ChargeJournal | None = None,
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        """`timer` measures how old a lease's renewal, its last use and held permits are: a
        monotonic clock, since a wall-clock step back (NTP, a resumed VM) would keep a lease
        the ledger has expired looking fresh, and a replica cut off from the ledger would go on
        spending money the ledger has handed to another replica."""
        self.admissions = admissions
        self.timer = timer
        self.client = client
        self.holder = holder
        self.config = config or LeaseConfig()
        self.journal = journal
        self._sending = 0  # batches sent but not yet acknowledged: their charges stay journaled
        self._unacknowledged: dict[int, tuple[str, list[Charge]]] = {}  # batch -> (hold, charges) in flight
        self._leases: dict[tuple[str, ...], _Lease] = {}  # the active lease per set of lines
        self._retired: dict[str, _Lease] = {}  # hold id -> lease waiting for in-flight requests
        self._locks: dict[tuple[str, ...], asyncio.Lock] = {}
        self._prefetch: dict[tuple[str, ...], asyncio.Task[_Lease | None]] = {}  # the next lease
        self._permit_lock = asyncio.Lock()
        self._open: dict[str, tuple[Admission, _Lease]] = {}
        self._permits: dict[str, _Permits] = {}
        self._alerts: dict[str, SoftAlert] = {}  # budget line -> the highest soft alert it raised
        self._maintainer: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ BudgetGate

    async def estimate(
        self, ctx: RequestContext, model: str, messages: list[dict[str, str]], max_tokens: int
    ) -> CostEstimate:
        return self.admissions.estimate(ctx, model, messages, max_tokens)

    async def reserve(self, ctx: RequestContext, estimate: CostEstimate) -> Reservation:
        self.start()
        a = self.admissions.admission(ctx, estimate)
        await self._take_permits(a.permits)
        try:
            lease = await self._lease_for(a)
        except BaseException:
            self._return_permits(a.permits)
            raise
        lease.used += a.amount_nanos
        lease.in_flight[a.reservation_id] = a.amount_nanos
        lease.last_used = self.timer()
        self._open[a.reservation_id] = (a, lease)
        if self.journal is not None:  # charged in full if this replica dies before it settles
            self.journal.reserve(lease.hold_id, a.provisional_charge())
        self._maybe_prefetch(a, lease)
        return Reservation(a.reservation_id, nanos_to_usd(a.amount_nanos), a.keys)

    async def settle(self, reservation: Reservation, bills: Sequence[Bill]) -> None:
        a, lease = self._open.pop(reservation.reservation_id)
        charges = a.charges(bills)
        # The estimate leaves the lease's in-flight part; the actual cost stays as used.
        lease.used += sum(c.nanos for c in charges) - lease.in_flight.pop(a.reservation_id)
        if self.journal is not None:
            for charge in charges:
                self.journal.append(lease.hold_id, charge)
            self.journal.settled(a.reservation_id)
        lease.pending.extend(charges)
        await self._after_request(lease)

    async def release(self, reservation: Reservation) -> None:
        a, lease = self._open.pop(reservation.reservation_id)
        lease.used -= lease.in_flight.pop(a.reservation_id)
        if self.journal is not None:
            self.journal.released(a.reservation_id)
        self._return_permits(a.permits)
        await self._after_request(lease)

    def open_reservations(self) -> int:
        """Requests reserved and neither settled nor released yet (0 when the gate is idle)."""
        return len(self._open)

    # ------------------------------------------------------------ leases

    async def _lease_for(self, a: Admission) -> _Lease:
        lock = self._locks.setdefault(a.keys, asyncio.Lock())
        async with lock:  # one lease request per set of lines at a time; the rest wait and share it
            lease = self._leases.get(a.keys)
            if lease is not None and lease.available >= a.amount_nanos and not self._stale(lease):
                return lease
            retiring = None
            if lease is not None:
                self._retire(lease)
                # Returned in the background: the new lease need not wait for the old one's trim.
                retiring = asyncio.get_running_loop().create_task(self._return_unused_logged(lease))
            fresh = await self._take_prefetched(a)
            if fresh is None:
                fresh = await self._hold_or_refuse(a, retiring)
            self._leases[a.keys] = fresh
            return fresh

    async def _hold_or_refuse(self, a: Admission, retiring: asyncio.Task[None] | None) -> _Lease:
        result = await self._new_hold(a)
        if isinstance(result, HoldRefused) and retiring is not None:
            await retiring  # the old lease's leftover may be just what this request needs
            result = await self._new_hold(a)
        if isinstance(result, HoldRefused) and await self._return_leases_on(result.key):
            result = await self._new_hold(a)  # this replica's other leases held the money
        if isinstance(result, HoldRefused):
            raise over_budget(result)
        if isinstance(result, PermitsRefused) or result.hold is None:
            raise AssertionError(f"the ledger answered a budget-only hold with {result!r}")
        now = self.timer()
        return _Lease(result.hold.hold_id, a.lines, result.hold.amount_nanos, now, now, result.hold.headroom_nanos)

    # ------------------------------------------------------------ prefetching the next lease

    def _maybe_prefetch(self, a: Admission, lease: _Lease) -> None:
        """Ask for the next lease in the background while the current one still has money, so
        requests do not wait for a round trip when it runs out."""
        if lease.retired or a.keys in self._prefetch:
            return
        if lease.available >= lease.granted * self.config.prefetch_below:
            return
        self._prefetch[a.keys] = asyncio.get_running_loop().create_task(self._prefetch_lease(a))

    async def _prefetch_lease(self, a: Admission) -> _Lease | None:
        try:
            result = await self._new_hold(a)
        except Exception:
            log.exception("prefetching a lease failed; the next request will ask itself")
            return None
        if not isinstance(result, Admitted) or result.hold is None:
            return None  # refused: the request that needs it will be refused with the details
        now = self.timer()
        return _Lease(result.hold.hold_id, a.lines, result.hold.amount_nanos, now, now, result.hold.headroom_nanos)

    async def _take_prefetched(self, a: Admission) -> _Lease | None:
        lease = await self._drop_prefetched(a.keys, keep=True)
        if lease is None or (lease.available >= a.amount_nanos and not self._stale(lease)):
            return lease
        self._retire(lease)  # too small for this request: give it back
        await self._close_retired(lease)
        return None

    async def _drop_prefetched(self, keys: tuple[str, ...], keep: bool = False) -> _Lease | None:
        """Wait for a pending prefetch; close its lease unless `keep`."""
        task = self._prefetch.pop(keys, None)
        lease = None if task is None else await task
        if lease is not None and not keep:
            self._retire(lease)
            await self._close_retired(lease)
            return None
        return lease

    async def _return_leases_on(self, key: str) -> bool:
        """Retire this replica's other leases on a budget line (e.g. other users' leases on the
        team's line) and return their unused money. True if there were any."""
        others = [lease for lease in self._leases.values() if any(line.key == key for line in lease.lines)]
        for lease in others:
            self._retire(lease)
            await self._return_unused(lease)
        prefetched = [keys for keys in self._prefetch if key in keys]
        for keys in prefetched:
            await self._drop_prefetched(keys)
        return bool(others or prefetched)

    async def _new_hold(self, a: Admission) -> Admitted | PermitsRefused | HoldRefused:
        want = a.amount_nanos * self.config.lease_requests
        hold = HoldRequest(
            uuid.uuid4().hex,
            self.holder,
            a.lines,
            a.amount_nanos,
            want,
            self.config.ttl_s,
            self.config.max_share,
        )
        return await self.client.admit((), hold)

    def _stale(self, lease: _Lease) -> bool:
        """Not renewed for `renew_cutoff_s`: the ledger may expire it before a new request ends."""
        return self.timer() - lease.renewed_at > self.config.renew_cutoff_s

    def _retire(self, lease: _Lease) -> None:
        """Stop reserving from a lease (its in-flight requests still settle against it)."""
        lease.retired = True
        keys = tuple(line.key for line in lease.lines)
        if self._leases.get(keys) is lease:
            del self._leases[keys]
        self._retired[lease.hold_id] = lease

    async def _return_unused_logged(self, lease: _Lease) -> None:
        try:
            await self._return_unused(lease)
        except Exception:
            # Its charges stay queued and upkeep closes it; only the return of money is late.
            log.exception("returning the unused part of hold %s failed; upkeep retries", lease.hold_id)

    async def _return_unused(self, lease: _Lease) -> None:
        """Return all of a retired lease but what its in-flight requests hold."""
        if not lease.in_flight:
            await self._close_retired(lease)
        else:
            await self._flush(lease, close=False, trim=True)

    async def _after_request(self, lease: _Lease) -> None:
        try:
            if lease.retired and not lease.in_flight:
                await self._close_retired(lease)
            elif len(lease.pending) >= self.config.flush_batch:
                await self._flush(lease, close=False)
        except Exception:
            # The charge is queued on the lease, not lost: upkeep sends it when the ledger is back.
            log.exception("cannot reach the ledger; charges of hold %s stay queued", lease.hold_id)

    async def _close_retired(self, lease: _Lease) -> None:
        await self._flush(lease, close=True)
        self._retired.pop(lease.hold_id, None)

    async def _flush(self, lease: _Lease, close: bool, trim: bool = False) -> None:
        async with lease.flush_lock:
            if lease.retired and not lease.in_flight and lease.hold_id not in self._retired:
                return  # closed by an earlier flush while this one waited
            keep = sum(lease.in_flight.values()) if trim and not close else None
            await self._send(lease, close, keep)

    async def _send(self, lease: _Lease, close: bool, keep: int | None) -> None:
        charges, lease.pending = lease.pending, []
        self._sending += 1
        batch = id(charges)
        self._unacknowledged[batch] = (lease.hold_id, charges)
        try:
            alerts = await self.client.settle(lease.hold_id, charges, close, keep)
        except BaseException:
            lease.pending[:0] = charges  # not recorded: send them again next time (ids make it safe)
            raise
        finally:
            self._sending -= 1
            del self._unacknowledged[batch]
        for alert in alerts:  # the highest threshold a line passed this period; its key names the period
            if alert.threshold >= self._alerts.get(alert.key, alert).threshold:
                self._alerts[alert.key] = alert

    def warnings(self, reservation: Reservation) -> list[str]:
        """Soft-alert thresholds the reservation's budget lines have passed this period, for
        the response header that tells the team (the ledger raises each alert once)."""
        return [
            f"{a.key} passed {a.threshold:.0%} of ${nanos_to_usd(a.limit_nanos):.6g}"
            for key in reservation.budgets
            if (a := self._alerts.get(key)) is not None
        ]

    def headroom(self, reservation: Reservation) -> Headroom:
        """The budget left is the ledger's headroom when this replica's lease was granted plus
        what of the lease is still unspent here; permits, the shared bucket's count at the
        last take plus those held here. Other replicas' spending since is not seen."""
        a, lease = self._open[reservation.reservation_id]
        budget = None if lease.headroom is None else nanos_to_usd(lease.headroom + max(lease.available, 0))
        left = {d.key: p.shared_left + max(p.count, 0) for d in a.permits if (p := self._permits.get(d.key))}
        return permit_headroom(budget, a, left)

    def _all_sent(self) -> bool:
        leases = (*self._leases.values(), *self._retired.values())
        return self._sending == 0 and not any(lease.pending for lease in leases)

    async def recover(self) -> RecoveryReport:
        """Send the journaled charges of dead replicas on this host (call before taking traffic)."""
        if self.journal is None:
            return RecoveryReport(0, 0, 0)

        async def send(hold_id: str, charges: Sequence[Charge]) -> None:
            await self.client.settle(hold_id, charges, close=True)

        return await recover_orphans(self.journal.directory, send)

    # ------------------------------------------------------------ rate-limit permits

    async def _take_permits(self, demands: tuple[PermitDemand, ...]) -> None:
        async with self._permit_lock:
            now = self.timer()
            short = tuple(
                PermitDemand(
                    d.key,
                    d.per_minute,
                    d.need - self._stock(d.key),
                    d.need + max(int(d.per_minute * self.config.permit_batch_s / 60), 0) - self._stock(d.key),
                )
                for d in demands
                if self._stock(d.key) < d.need
            )
            if short:
                result = await self.client.admit(short, None)
                if isinstance(result, PermitsRefused):
                    raise rate_limited(result)
                if isinstance(result, HoldRefused):
                    raise AssertionError(f"the ledger answered a permits-only request with {result!r}")
                for d in short:
                    p = self._permits.setdefault(d.key, _Permits(d.per_minute, 0, now))
                    p.count += result.permits[d.key]
                    p.taken_at = now
                    p.shared_left = result.permits_left.get(d.key, 0)
            for d in demands:
                self._permits[d.key].count -= d.need

    def _stock(self, key: str) -> int:
        p = self._permits.get(key)
        return 0 if p is None else p.count

    def _return_permits(self, demands: tuple[PermitDemand, ...]) -> None:
        """A request that never reached a provider gives its permits back to the local stock."""
        for d in demands:
            if d.key in self._permits:
                self._permits[d.key].count += d.need

    # ------------------------------------------------------------ upkeep

    def start(self) -> None:
        """Start the upkeep task (renewals, batched charges, idle leases) on the running loop."""
        if self._maintainer is None or self._maintainer.done():
            self._maintainer = asyncio.get_running_loop().create_task(self._upkeep_loop())

    async def _upkeep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.config.flush_every_s)
            try:
                await self.maintain()
            except Exception:
                # The ledger may be restarting; pending charges stay queued and go next round.
                log.exception("budget upkeep failed; retrying in %.2fs", self.config.flush_every_s)

    async def maintain(self) -> None:
        now = self.timer()
        await self.client.renew(self.holder, self.config.ttl_s)
        for lease in (*self._leases.values(), *self._retired.values()):
            lease.renewed_at = now  # one renewal extends every hold of this replica
        for lease in list(self._leases.values()):
            if not lease.in_flight and now - lease.last_used > self.config.idle_close_s:
                self._retire(lease)
                await self._close_retired(lease)
            elif lease.pending:
                await self._flush(lease, close=False)
        for lease in list(self._retired.values()):
            if not lease.in_flight:
                await self._close_retired(lease)
            elif lease.pending:
                await self._flush(lease, close=False)
        for keys in [k for k in self._prefetch if k not in self._leases]:
            await self._drop_prefetched(keys)  # its lease went idle: the next one is not needed
        await self._give_back_stale_permits(now)
        for keys in [k for k, lock in self._locks.items() if k not in self._leases and not lock.locked()]:
            del self._locks[keys]  # yesterday's lines and departed users
        if self.journal is not None and self._all_sent():
            self.journal.clear()  # no await since the check: nothing can have been journaled in between
        elif self.journal is not None and self.journal.size_bytes() > self.config.journal_compact_bytes:
            self.journal.rewrite(self._unsent())  # no await in between either

    def _unsent(self) -> list[tuple[str, Charge]]:
        """Charges the ledger has not acknowledged: queued on a lease, or in a batch in flight."""
        leases = (*self._leases.values(), *self._retired.values())
        queued = [(lease.hold_id, c) for lease in leases for c in lease.pending]
        return queued + [(hold, c) for hold, charges in self._unacknowledged.values() for c in charges]

    async def _give_back_stale_permits(self, now: float) -> None:
        stale = {
            k: p for k, p in self._permits.items() if p.count > 0 and now - p.taken_at > self.config.permit_batch_s
        }
        if stale:
            await self.client.give_back(
                {k: p.count for k, p in stale.items()}, {k: p.per_minute for k, p in stale.items()}
            )
            for p in stale.values():
                p.count = 0

    async def aclose(self) -> None:
        """Send every charge and return every unused lease and permit (replica shutdown)."""
        if self._maintainer is not None:
            self._maintainer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._maintainer
        for keys in list(self._prefetch):
            await self._drop_prefetched(keys)
        for lease in list(self._leases.values()):
            self._retire(lease)
        for lease in list(self._retired.values()):
            if lease.in_flight:
                log.warning(
                    "closing with %d requests in flight on hold %s; their charges may arrive"
                    " after the hold expires (still counted)",
                    len(lease.in_flight),
                    lease.hold_id,
                )
            if lease.in_flight:
                await self._flush(lease, close=False, trim=True)
            else:
                await self._close_retired(lease)
        await self._give_back_stale_permits(float("inf"))
        if self.journal is not None and self._all_sent():
            self.journal.close()
