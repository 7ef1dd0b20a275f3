"""Inference never waits for starving gangs (issue 18): escalation and starving reservations
must not use up the victim searches inference reclaim needs, nor take its lent pool back
from it. Regression for escalation lowering September's inference SLO to 0.9995."""

from __future__ import annotations

from dataclasses import replace

from sched_support import ALL_CLASSES, gang
from test_sched_starvation import CLASSES, HOUR, KNOBS

from switchyard.scheduler.core import Node, PreemptionReason, Quota, Scheduler, SchedulerPolicy, Team, WorkloadClass
from switchyard.scheduler.core.model import HoldKind

RESEARCH = frozenset(ALL_CLASSES - {WorkloadClass.INFERENCE})


def _cluster() -> Scheduler:
    """32 GPUs. Inference guarantees 8, idle and lent to team f, whose 8-GPU training gang
    borrows them; team e runs its 24-GPU guarantee as exploratory work. Teams a, b, c have
    no guarantee and each queue an 8-GPU training gang: blocked by capacity, they search for
    victims (lower-priority GPUs exist) and find none. Two victim searches per decision."""
    teams = (
        Team("inference", (Quota(frozenset({WorkloadClass.INFERENCE}), 8, borrowing_limit_gpus=0),), 8.0),
        Team("e", (Quota(RESEARCH, 24),), 24.0),
        *(Team(t, (Quota(RESEARCH, 0),), 1.0) for t in "abcf"),
    )
    knobs = replace(KNOBS, max_preemption_attempts=2, starving_reservations_per_team=1)
    nodes = [Node(f"n{i}", 8, "g0", "r0") for i in range(4)]
    s = Scheduler(SchedulerPolicy(CLASSES, teams, knobs), nodes)
    for i in range(3):
        s.submit(gang(f"e-{i}", "e", (8,), "exploratory"), 0)
    s.submit(gang("f-0", "f", (8,), "training"), 0)
    assert len(s.schedule(0).starts) == 4
    for team in "abc":
        s.submit(gang(f"{team}-0", team, (8,), "training"), 10)
    return s


def test_inference_reclaims_while_starving_gangs_use_up_the_victim_searches() -> None:
    s = _cluster()
    now = 20.0
    while now < 1.5 * HOUR:  # past the first bound only: each gang holds a starving reservation
        assert not s.schedule(now).notices
        now += 61.0  # past preemption_retry_s: every gang searches again in each decision
    kinds = {r.workload_id: r.kind for r in s.schedule(now).reservations}
    # Two starving gangs go first and search: the whole budget of the decision.
    assert kinds == dict.fromkeys(("a-0", "b-0"), HoldKind.STARVING)
    now += 61.0
    s.submit(gang("inference-0", "inference", (1,), "production-inference"), now)
    reclaim = [n for n in s.schedule(now).notices if n.preemptor == "inference-0"]
    # Before the fix the three starving gangs searched first and left inference no budget.
    assert [(n.workload_id, n.reason) for n in reclaim] == [("f-0", PreemptionReason.RECLAIM)]
