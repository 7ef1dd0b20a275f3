"""Queued requests past the inversion bound, counted by (priority, team) and size, as the
fairness module's `InversionLedger` reads them; kept incrementally, because the simulator
and the live driver ask at every event and the queue can hold thousands."""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class _Queued:
    since: float
    workload_id: str
    priority: int
    team: str
    gpus: int


class OverdueWaits:
    def __init__(self, bound_s: float) -> None:
        self.bound_s = bound_s
        self._young: deque[_Queued] = deque()  # queue order is time order: a request (re)joins now
        self._since: dict[str, float] = {}  # queued workload -> when it (re)joined
        self._overdue: dict[str, _Queued] = {}
        self.by_level: dict[tuple[int, str], Counter[int]] = {}
        """(priority, team) -> sizes of the requests queued longer than the bound."""

    def add(self, workload_id: str, priority: int, team: str, gpus: int, since: float) -> None:
        self._since[workload_id] = since
        self._young.append(_Queued(since, workload_id, priority, team, gpus))

    def remove(self, workload_id: str) -> None:
        self._since.pop(workload_id, None)  # its young entry, if any, is skipped when it ages
        queued = self._overdue.pop(workload_id, None)
        if queued is not None:
            sizes = self.by_level[(queued.priority, queued.team)]
            sizes[queued.gpus] -= 1
            if sizes[queued.gpus] == 0:
                del sizes[queued.gpus]
            if not sizes:
                del self.by_level[(queued.priority, queued.team)]

    def _drop_stale(self) -> None:
        while self._young and self._since.get(self._young[0].workload_id) != self._young[0].since:
            self._young.popleft()  # started or cancelled since (or re-queued: a newer entry follows)

    def next_due(self) -> float | None:
        """When the oldest request not yet overdue becomes overdue."""
        self._drop_stale()
        return self._young[0].since + self.bound_s if self._young else None

    def advance(self, now: float) -> None:
        """Requests queued for the bound or longer at `now` become overdue."""
        self._drop_stale()
        while self._young and now - self._young[0].since >= self.bound_s:
            queued = self._young.popleft()
            self._overdue[queued.workload_id] = queued
            self.by_level.setdefault((queued.priority, queued.team), Counter())[queued.gpus] += 1
            self._drop_stale()
