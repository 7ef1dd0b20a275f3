"""What operators and researchers see of the queue: each waiting workload's wait, position,
attempt and reason, and per-team wait percentiles over the last hour and day.

Pure (no Ray): the live scheduler feeds it what its core holds; `switchyard status` and
`switchyard train list` print it.

A team's waits over a window are those of the workloads it started in the window (time from
(re)queue to admission, as the wait histogram counts them) plus the wait so far of those still
queued: a queue that never admits anything must not look like no wait at all.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from switchyard.scheduler.core.model import PendingWorkload
from switchyard.scheduler.core.pending import PendingExplanation
from switchyard.scheduler.fairness import percentile

WINDOWS_S = {"1h": 3600.0, "1d": 86400.0}


@dataclass(frozen=True, slots=True)
class QueueRow:
    workload_id: str
    waited_s: float
    position: int  # 1-based, within its team's queue of its priority class (FIFO there)
    attempt: int  # 1 on first submission; +1 each time it is requeued after running
    reason: str
    detail: str


def queue_rows(
    pending: Sequence[PendingWorkload], explain: Callable[[PendingWorkload], PendingExplanation], now: float
) -> dict[str, QueueRow]:
    """A row for every waiting workload, by workload id."""
    groups: dict[tuple[str, str], list[PendingWorkload]] = {}
    for p in pending:
        groups.setdefault((p.request.team, p.request.priority_class), []).append(p)
    rows = {}
    for members in groups.values():
        for position, p in enumerate(sorted(members, key=lambda m: (m.queued_at, m.request.workload_id)), 1):
            why = explain(p)
            rows[p.request.workload_id] = QueueRow(
                p.request.workload_id,
                max(0.0, now - p.queued_at),
                position,
                p.attempts + 1,
                why.reason.value,
                why.detail,
            )
    return rows


@dataclass
class WaitLog:
    """Admissions of the last day: (time, team, waited seconds). Bounded by pruning anything
    older than the longest window at each record."""

    keep_s: float = max(WINDOWS_S.values())
    admissions: deque[tuple[float, str, float]] = field(default_factory=deque)

    def record(self, team: str, at: float, waited_s: float) -> None:
        self.admissions.append((at, team, waited_s))
        while self.admissions and self.admissions[0][0] < at - self.keep_s:
            self.admissions.popleft()

    def summary(self, now: float, queued: Iterable[tuple[str, float]]) -> dict[str, dict[str, dict[str, float]]]:
        """team -> window -> {p50, p90, max, n}, over admissions in the window and the current
        waits of `queued` (team, waited so far)."""
        still = list(queued)
        out: dict[str, dict[str, dict[str, float]]] = {}
        teams = {team for _, team, _ in self.admissions} | {team for team, _ in still}
        for team in sorted(teams):
            out[team] = {}
            for name, span in WINDOWS_S.items():
                waits = [w for at, t, w in self.admissions if t == team and at >= now - span]
                waits += [w for t, w in still if t == team]
                out[team][name] = {
                    "p50": percentile(waits, 50),
                    "p90": percentile(waits, 90),
                    "max": max(waits, default=0.0),
                    "n": float(len(waits)),
                }
        return out
