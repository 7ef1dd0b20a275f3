"""The `kueue` baseline admits as Kueue does (issue 18, finding 4): every request inside its
nominal quota before any that would borrow, whatever their priorities, then priority, then
queue time (kueue pkg/scheduler/scheduler.go, `entryOrdering.Less`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from sched_support import gang, nodes, policy

from switchyard.scheduler.core import PolicyKnobs, PreemptionMode, Scheduler
from switchyard.scheduler.core.policy import Ordering
from switchyard.scheduler.sim.baselines import PolicyName, knobs_for

KUEUE = knobs_for(PolicyName.KUEUE, PolicyKnobs())


def _started(knobs: PolicyKnobs) -> list[str]:
    """8 GPUs, teams a and b with 4 guaranteed each. a's 6-GPU training gang (it would borrow
    2) is queued before b's 4-GPU exploratory job (inside b's guarantee)."""
    core = Scheduler(policy({"a": 4, "b": 4}, knobs), nodes(1), now=0.0)
    core.submit(gang("a-train", "a", (6,), "training"), 0.0)
    core.submit(gang("b-explore", "b", (4,), "exploratory"), 1.0)
    return [s.workload_id for s in core.schedule(2.0).starts]


def test_kueue_admits_the_request_inside_its_guarantee_first() -> None:
    assert KUEUE.nominal_first and KUEUE.ordering is Ordering.PRIORITY
    assert _started(KUEUE) == ["b-explore"]


def test_priority_order_without_it_lets_the_borrower_go_first() -> None:
    assert _started(replace(KUEUE, nominal_first=False)) == ["a-train"]


@pytest.mark.parametrize("mode", [PreemptionMode.KUEUE, PreemptionMode.NONE])
def test_a_borrower_still_starts_in_the_same_decision(mode: PreemptionMode) -> None:
    """Nothing inside a guarantee waits: the borrower starts in the second pass, and the job
    queued behind it in its own queue follows it (Kueue considers one head per queue)."""
    core = Scheduler(policy({"a": 4, "b": 4}, replace(KUEUE, preemption=mode)), nodes(1), now=0.0)
    core.submit(gang("a-train", "a", (6,), "training"), 0.0)
    core.submit(gang("a-small", "a", (2,), "training"), 0.5)
    assert [s.workload_id for s in core.schedule(1.0).starts] == ["a-train", "a-small"]
