"""Why a queued workload has not started: the reason an operator (or the simulator's report)
shows beside it. Checked in this order, so each reason names the first thing in the way."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class PendingReason(Enum):
    PREEMPTING = "preempting"
    """Its victims have been noticed; the GPUs they free are held for it."""
    QUOTA = "quota"
    """Its quota entry refuses it (over guarantee and may not borrow, borrowing limit), or a
    cohort above it does (the detail names the cohort, its GPU type and the limit)."""
    CAPACITY = "capacity"
    """Fewer GPUs are free than it asks for, or none are left to lend to a borrower."""
    GANG_FIT = "gang fit"
    """Enough GPUs are free, but not in the shape its bundles and topology need."""
    RESERVATION = "reservation"
    """It would fit, but on GPUs held for other gangs' reservations."""
    TEAM_ORDER = "team order"
    """An older request of its own team, at its priority or above, has waited past
    `starvation_after_s` and goes first (knob `starving_blocks_team`, `core.team_order`)."""
    QUEUE_ORDER = "queue order"
    """It fits now: the next decision may start it (it arrived since the last one, or work
    ahead of it used the decision: a blocked head without backfill, the victim-search budget)."""


@dataclass(frozen=True, slots=True)
class PendingExplanation:
    reason: PendingReason
    detail: str


_PROGRESS = list(PendingReason)  # the order above: each reason is one check further along


def furthest(explanations: list[PendingExplanation]) -> PendingExplanation:
    """The explanation that got furthest through the checks (the first of equals): for a
    request that may take several GPU types, the type it is closest to starting on."""
    return max(explanations, key=lambda why: _PROGRESS.index(why.reason))
