"""A starving request goes before its own team's later work (knob `starving_blocks_team`).

Backfill lets a team's small jobs start past its own blocked gang; under load they keep the
team's usage (and the capacity it may borrow) taken, and the gang starves before its first
start (issue 18: a 32-GPU gang of a 28-GPU team waited 13 days behind its team's 8-GPU jobs).
Once a request has waited past `starvation_after_s` it *holds back* every request of its team
that was submitted after it, at its priority or below, and would borrow: those wait until it
starts (Kueue's StrictFIFO queueing, applied per team and only once a request starves). What
a team borrows goes to its oldest starving request first; within its guarantee its work goes
on, as do other teams and its team's higher priorities. A gang whose victims are already
leaving for it (a preemptor's hold) still starts: its GPUs were taken for it. Only a request
that capacity blocks holds anything back: one its quota refuses (a borrowing limit, a class
that may not borrow) could wait behind its team's own work inside the guarantee for ever,
and its team's borrowing with it. (Both quota tests need the quota book, so the scheduler
makes them: `Scheduler._team_order_holds` and `may_hold` here.)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from switchyard.scheduler.core.model import PendingWorkload
from switchyard.scheduler.core.policy import PolicyKnobs


class HeldBack:
    """For one decision: per team and priority value, the submit time of the team's oldest
    starving queued request at that value."""

    def __init__(
        self,
        knobs: PolicyKnobs,
        value_of: Callable[[PendingWorkload], int],
        may_hold: Callable[[PendingWorkload], bool],
        now: float,
    ) -> None:
        self._knobs = knobs
        self._value_of = value_of
        self._may_hold = may_hold  # capacity, not its quota, blocks it
        self._now = now
        self._oldest: dict[str, dict[int, float]] = {}

    def add_heads(self, heads: Iterable[PendingWorkload]) -> None:
        """`heads`: the oldest request of each queue group (a group is in submit order)."""
        bound = self._knobs.starvation_after_s
        if bound is None:
            return
        cutoff = self._now - bound  # inline `is_starving`: this runs over every group each decision
        for head in heads:
            if head.submitted_at < cutoff and self._may_hold(head):
                levels = self._oldest.setdefault(head.request.team, {})
                value = self._value_of(head)
                levels[value] = min(levels.get(value, head.submitted_at), head.submitted_at)

    def __bool__(self) -> bool:
        """Whether any request holds anything back."""
        return any(self._oldest.values())

    def holds_back(self, pending: PendingWorkload) -> bool:
        levels = self._oldest.get(pending.request.team)
        if not levels:
            return False
        value = self._value_of(pending)
        return any(v >= value and t < pending.submitted_at for v, t in levels.items())

    def started(self, pending: PendingWorkload, heads: Callable[[], Iterable[PendingWorkload]]) -> None:
        """`pending` started: if it was its team's oldest starving request at its value, the
        next oldest (among the queue's `heads` now) takes its place."""
        team = pending.request.team
        value = self._value_of(pending)
        levels = self._oldest.get(team)
        if not levels or levels.get(value) != pending.submitted_at:
            return
        del levels[value]
        self.add_heads(h for h in heads() if h.request.team == team and self._value_of(h) == value)
