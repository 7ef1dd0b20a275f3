"""Who held and who wanted GPUs over time: the one feed of the fairness ledgers.

The simulator and the live driver both keep a `FairnessTimeline`: they tell it as GPUs are
taken and given back (`hold`) and as requests join and leave the queue (`queue`, `dequeue`),
and hand it each interval in which nothing changed (`observe`). It turns that into what
`switchyard.scheduler.fairness` defines: each team's received and fair GPU-seconds per hour
(`ShareLedger`: demand is held plus queued, weights are guarantees) and the GPU-seconds of
requests queued past the inversion bound while lower priorities held GPUs they could use
(`InversionLedger`). So a live number and a simulated one are the same computation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from switchyard.scheduler.fairness import HOUR_S, InversionLedger, ShareLedger
from switchyard.scheduler.overdue import OverdueWaits


class FairnessTimeline:
    def __init__(
        self,
        guarantees: Mapping[str, int],
        capacity: int,
        inversion_bound_s: float,
        start_s: float = 0.0,
        keep_hours: int | None = None,
    ) -> None:
        """`guarantees`: GPUs guaranteed per team (its weight in the fair share); `start_s`:
        where hour 0 begins; `keep_hours`: see `ShareLedger`."""
        self.capacity = capacity
        self.shares = ShareLedger(start_s, guarantees, keep_hours)
        self.inversions = InversionLedger(guarantees)
        self.allocated: dict[str, int] = {}
        """Team -> GPUs it holds."""
        self.queued_gpus: dict[str, int] = {}
        """Team -> GPUs its queued requests ask for."""
        self._held_by_priority: dict[int, int] = {}
        self._overdue = OverdueWaits(inversion_bound_s)
        self._keep_hours = keep_hours
        self._hourly_inversions: dict[int, InversionLedger] = {}
        """With `keep_hours`: the same sums per hour, the newest `keep_hours` (the live
        scheduler's "last day"); the totals above cover everything since the start."""

    def hold(self, team: str, priority: int, gpus: int) -> None:
        """`gpus` more held (negative: given back) by a lease of `team` at priority value `priority`."""
        self.allocated[team] = self.allocated.get(team, 0) + gpus
        self._held_by_priority[priority] = self._held_by_priority.get(priority, 0) + gpus

    def queue(self, workload_id: str, team: str, priority: int, gpus: int, since: float) -> None:
        """A request (re)joins the queue, waiting since `since`."""
        self.queued_gpus[team] = self.queued_gpus.get(team, 0) + gpus
        self._overdue.add(workload_id, priority, team, gpus, since)

    def dequeue(self, workload_id: str, team: str, gpus: int) -> None:
        """A queued request left the queue (started, or withdrawn)."""
        self.queued_gpus[team] = self.queued_gpus.get(team, 0) - gpus
        self._overdue.remove(workload_id)

    def observe(self, lo: float, hi: float) -> None:
        """Nothing started, stopped or joined the queue in [lo, hi)."""
        alloc = self.allocated
        demand = dict(alloc)
        for team, gpus in self.queued_gpus.items():
            if gpus:
                demand[team] = demand.get(team, 0) + gpus
        self.shares.observe(lo, hi, self.capacity, alloc, demand)
        # Nothing starts or stops inside [lo, hi), but requests cross the bound: split there.
        while lo < hi:
            self._overdue.advance(lo)
            due = self._overdue.next_due()
            edge = hi if due is None or due >= hi else max(due, lo)
            levels = self._overdue.by_level
            if levels:
                held_below = {
                    p: sum(g for v, g in self._held_by_priority.items() if v < p) for p in {p for p, _ in levels}
                }
                self.inversions.observe(edge - lo, levels, held_below, alloc)
                if self._keep_hours is not None:
                    self._observe_hourly(lo, edge, levels, held_below, alloc)
            lo = edge

    def recent_inversions(self, now: float, hours: int) -> InversionLedger:
        """Inversion and quota-wait GPU-seconds of the `hours` hours up to `now` (whole hours:
        the one `now` is in and the `hours - 1` before it). Needs `keep_hours`."""
        newest = self.shares.hour_of(now)
        out = InversionLedger(self.inversions.guarantees)
        for index, ledger in self._hourly_inversions.items():
            if newest - hours < index <= newest:
                for team, gpu_s in ledger.inversion_gpu_s.items():
                    out.inversion_gpu_s[team] = out.inversion_gpu_s.get(team, 0.0) + gpu_s
                for team, gpu_s in ledger.quota_wait_gpu_s.items():
                    out.quota_wait_gpu_s[team] = out.quota_wait_gpu_s.get(team, 0.0) + gpu_s
        return out

    def _observe_hourly(
        self,
        lo: float,
        hi: float,
        levels: Mapping[tuple[int, str], Counter[int]],
        held_below: Mapping[int, int],
        alloc: Mapping[str, int],
    ) -> None:
        assert self._keep_hours is not None
        while lo < hi:
            index = self.shares.hour_of(lo)
            edge = min(hi, self.shares.start_s + (index + 1) * HOUR_S)
            ledger = self._hourly_inversions.get(index)
            if ledger is None:
                ledger = self._hourly_inversions[index] = InversionLedger(self.inversions.guarantees)
                for old in [i for i in self._hourly_inversions if i <= index - self._keep_hours]:
                    del self._hourly_inversions[old]
            ledger.observe(edge - lo, levels, held_below, alloc)
            lo = edge
