"""Bounded waits: when a waiting gang gets a reservation of its own, and when it may escalate.

Rules (pure; the bound they give is stated in docs/scheduler.md, "Bounded waits"):
  * a gang queued longer than `starvation_after_s` (since submission) is *starving*: it takes a
    reservation of its own, up to `starving_reservations_per_team` per team (the blocked-head
    reservations of `max_reservations` and the holds of preemptors count in neither);
  * a starving gang queued longer than `starvation_preempt_after_s` may *escalate*: preempt
    leases of a strictly lower priority class past their protection from priority
    preemption, of any team, whether or not their team is borrowing.
"""

from __future__ import annotations

from switchyard.scheduler.core.model import HoldKind, PendingWorkload
from switchyard.scheduler.core.policy import PolicyKnobs


def is_starving(pending: PendingWorkload, knobs: PolicyKnobs, now: float) -> bool:
    bound = knobs.starvation_after_s
    return bound is not None and now - pending.submitted_at > bound


def may_escalate(pending: PendingWorkload, knobs: PolicyKnobs, now: float) -> bool:
    bound = knobs.starvation_preempt_after_s
    return bound is not None and is_starving(pending, knobs, now) and now - pending.submitted_at > bound


class HoldCounts:
    """How many reservations of each kind are held, and starving ones per team: kept as holds
    come and go, because the scheduler asks for every blocked gang of every decision (counting
    the holds each time was the largest single cost of a decision at 10k GPUs)."""

    def __init__(self) -> None:
        self._by_kind: dict[HoldKind, int] = {}
        self._starving_by_team: dict[str, int] = {}

    def add(self, kind: HoldKind, team: str) -> None:
        self._by_kind[kind] = self._by_kind.get(kind, 0) + 1
        if kind is HoldKind.STARVING:
            self._starving_by_team[team] = self._starving_by_team.get(team, 0) + 1

    def remove(self, kind: HoldKind, team: str) -> None:
        self._by_kind[kind] -= 1
        if kind is HoldKind.STARVING:
            self._starving_by_team[team] -= 1

    def of_kind(self, kind: HoldKind) -> int:
        return self._by_kind.get(kind, 0)

    def starving_of(self, team: str) -> int:
        return self._starving_by_team.get(team, 0)


def reservation_to_take(
    pending: PendingWorkload,
    knobs: PolicyKnobs,
    now: float,
    have: HoldKind | None,
    counts: HoldCounts,
) -> HoldKind | None:
    """Which reservation a blocked gang should now hold (None: keep what it has, or none).

    `have` is the reservation it holds now, `counts` every held reservation by kind."""
    if have is HoldKind.PREEMPTOR or have is HoldKind.STARVING:
        return None
    if is_starving(pending, knobs, now) and counts.starving_of(pending.request.team) < (
        knobs.starving_reservations_per_team
    ):
        return HoldKind.STARVING
    if have is None and counts.of_kind(HoldKind.BLOCKED_HEAD) < knobs.max_reservations:
        return HoldKind.BLOCKED_HEAD
    return None
