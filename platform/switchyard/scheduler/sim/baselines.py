"""The policies compared, as knob settings of the one core (same placement code for all)."""

from __future__ import annotations

from dataclasses import replace
from enum import StrEnum

from switchyard.scheduler.core.policy import Ordering, PolicyKnobs, PreemptionMode, PriorityClass


class PolicyName(StrEnum):
    SWITCHYARD = "switchyard"
    FIFO = "fifo"
    PRIORITY = "priority"
    STATIC = "static"
    KUEUE = "kueue"


def knobs_for(name: PolicyName, switchyard: PolicyKnobs) -> PolicyKnobs:
    grace = switchyard.preemption_grace_s
    if name is PolicyName.SWITCHYARD:
        return switchyard
    return replace(_baseline(name, switchyard, grace), starvation_after_s=None, restart_cost_s=0.0)


def classes_for(name: PolicyName, classes: tuple[PriorityClass, ...]) -> tuple[PriorityClass, ...]:
    """The priority classes a policy runs with: the baselines keep minimum runtimes against
    priority preemption (Kueue and strict priority have none of switchyard's reclaim
    protection, backoff or preemption cap), switchyard keeps everything."""
    if name is PolicyName.SWITCHYARD:
        return classes
    return tuple(_min_runtime_only(c) for c in classes)


def _min_runtime_only(c: PriorityClass) -> PriorityClass:
    return replace(
        c, reclaim_min_runtime_s=0.0, preemption_backoff_s=0.0, max_preemption_backoff_s=0.0, max_preemptions=None
    )


def _baseline(name: PolicyName, switchyard: PolicyKnobs, grace: float) -> PolicyKnobs:
    if name is PolicyName.FIFO:
        # Submit order, no quotas, no preemption; the head of the queue blocks everyone.
        return PolicyKnobs(
            Ordering.FIFO,
            PreemptionMode.NONE,
            borrowing=True,
            enforce_quota=False,
            backfill=False,
            max_reservations=0,
            preemption_grace_s=grace,
        )
    if name is PolicyName.PRIORITY:
        # Strict priority: no quotas; a higher priority preempts lower (lowest, newest first).
        return PolicyKnobs(
            Ordering.PRIORITY,
            PreemptionMode.PRIORITY,
            borrowing=True,
            enforce_quota=False,
            backfill=True,
            max_reservations=0,
            preemption_grace_s=grace,
        )
    if name is PolicyName.STATIC:
        # Each team capped at its guarantee, FIFO within it, nothing borrowed or preempted.
        return PolicyKnobs(
            Ordering.PRIORITY,
            PreemptionMode.NONE,
            borrowing=False,
            enforce_quota=True,
            backfill=True,
            max_reservations=0,
            preemption_grace_s=grace,
        )
    # Kueue-like: quota + borrowing + priority/reclaim preemption, BestEffortFIFO, no
    # reservations, victims ordered without regard to checkpoints; requests inside their
    # nominal quota are admitted before borrowing ones, whatever their priority (Kueue's
    # entryOrdering.Less).
    return PolicyKnobs(
        Ordering.PRIORITY,
        PreemptionMode.KUEUE,
        nominal_first=True,
        borrowing=True,
        enforce_quota=True,
        backfill=True,
        max_reservations=0,
        preemption_grace_s=grace,
        max_preemption_attempts=switchyard.max_preemption_attempts,
    )
