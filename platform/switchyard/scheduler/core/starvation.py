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

from collections.abc import Mapping

from switchyard.scheduler.core.model import HoldKind, PendingWorkload
from switchyard.scheduler.core.policy import PolicyKnobs


def is_starving(pending: PendingWorkload, knobs: PolicyKnobs, now: float) -> bool:
    bound = knobs.starvation_after_s
    return bound is not None and now - pending.submitted_at > bound


def may_escalate(pending: PendingWorkload, knobs: PolicyKnobs, now: float) -> bool:
    bound = knobs.starvation_preempt_after_s
    return bound is not None and is_starving(pending, knobs, now) and now - pending.submitted_at > bound


def reservation_to_take(
    pending: PendingWorkload,
    knobs: PolicyKnobs,
    now: float,
    kinds: Mapping[str, HoldKind],
    team_of: Mapping[str, str],
) -> HoldKind | None:
    """Which reservation a blocked gang should now hold (None: keep what it has, or none).

    `kinds` is every held reservation's kind by workload, `team_of` its team."""
    workload = pending.request.workload_id
    have = kinds.get(workload)
    if have is HoldKind.PREEMPTOR or have is HoldKind.STARVING:
        return None
    if is_starving(pending, knobs, now):
        team = pending.request.team
        taken = sum(1 for w, k in kinds.items() if k is HoldKind.STARVING and team_of[w] == team)
        if taken < knobs.starving_reservations_per_team:
            return HoldKind.STARVING
    if have is None and sum(1 for k in kinds.values() if k is HoldKind.BLOCKED_HEAD) < knobs.max_reservations:
        return HoldKind.BLOCKED_HEAD
    return None
