"""A starving request goes before its own team's later work (knob `starving_blocks_team`,
`core.team_order`; issue 18: a 32-GPU gang of a 28-GPU team waited 13 days while its team's
later 8-GPU jobs started)."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
from sched_support import ALL_CLASSES, gang, nodes, policy

from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    LeaseState,
    PolicyKnobs,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
)
from switchyard.scheduler.core.model import HoldKind, PendingWorkload

HOUR = 3600.0
KNOBS = PolicyKnobs(starvation_after_s=HOUR, starving_blocks_team=True, max_reservations=0)


def _started(s: Scheduler, now: float) -> list[str]:
    return [start.workload_id for start in s.schedule(now).starts]


def _blocked_big_gang(knobs: PolicyKnobs) -> Scheduler:
    """a (4 guaranteed) runs a 4-GPU job and b a whole node: a's 16-GPU batch gang waits for
    the whole cluster. A later 4-GPU job of a borrows, and starts while the gang is young."""
    s = Scheduler(policy({"a": 4, "b": 8}, knobs), nodes(2))
    s.submit(gang("a-0", "a", (4,), "training"), 0)
    s.submit(gang("b-0", "b", (8,), "training"), 0)
    assert _started(s, 0) == ["a-0", "b-0"]
    s.submit(gang("a-big", "a", (8, 8), "batch", same_group=True), 1)
    s.submit(gang("a-early", "a", (4,), "exploratory"), 10)
    assert _started(s, 10) == ["a-early"]  # a-big is not starving yet: backfill as usual
    s.release("a-early#1", 20, finished=True)
    return s


def test_without_the_rule_a_teams_later_job_overtakes_its_starving_gang() -> None:
    s = _blocked_big_gang(replace(KNOBS, starving_blocks_team=False))
    s.submit(gang("a-late", "a", (4,), "exploratory"), HOUR + 10)
    assert _started(s, HOUR + 10) == ["a-late"]


def test_a_starving_gang_holds_back_its_teams_later_borrowing_work_only() -> None:
    s = _blocked_big_gang(KNOBS)
    s.submit(gang("a-late", "a", (4,), "exploratory"), HOUR + 10)
    assert _started(s, HOUR + 10) == []  # a-big starves: a's later work that would borrow waits
    reasons = {p.workload_id: p.reason for p in s.snapshot(HOUR + 10).pending}
    assert reasons == {"a-big": "capacity", "a-late": "team order"}  # each says why it waits
    s.submit(gang("a-urgent", "a", (2,), "training"), HOUR + 20)
    assert _started(s, HOUR + 20) == ["a-urgent"]  # a priority above the gang's goes on
    s.release("a-urgent#1", HOUR + 30, finished=True)
    s.release("a-0#1", HOUR + 30, finished=True)
    assert _started(s, HOUR + 30) == ["a-late"]  # within a's guarantee now: it goes on
    s.release("b-0#1", HOUR + 40, finished=True)
    s.submit(gang("b-late", "b", (4,), "exploratory"), HOUR + 40)
    assert _started(s, HOUR + 40) == ["b-late"]  # another team is never held back
    s.submit(gang("a-later", "a", (4,), "exploratory"), HOUR + 50)
    s.release("b-late#1", HOUR + 60, finished=True)
    s.release("a-late#1", HOUR + 60, finished=True)
    assert _started(s, HOUR + 60) == ["a-big"]  # the gang first, then its team's later work
    s.release("a-big#1", HOUR + 70, finished=True)
    assert _started(s, HOUR + 70) == ["a-later"]


def test_a_gang_its_quota_refuses_holds_nothing_back() -> None:
    """A starving gang over its team's borrowing limit waits for its quota, not for capacity:
    holding the team's later borrowing work back would not help it, and it could wait behind
    the team's work inside its guarantee for ever, its team's borrowing with it."""
    teams = (
        Team("a", (Quota(ALL_CLASSES, 4, borrowing_limit_gpus=4),), 4.0),
        Team("b", (Quota(ALL_CLASSES, 12),), 12.0),
    )
    s = Scheduler(SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, teams, KNOBS), nodes(2))
    s.submit(gang("a-0", "a", (4,), "training"), 0)
    assert _started(s, 0) == ["a-0"]
    s.submit(gang("a-big", "a", (8,), "training"), 1)  # 4 + 8 > 4 guaranteed + 4 borrowed
    assert _started(s, HOUR + 10) == []
    s.submit(gang("a-late", "a", (2,), "exploratory"), HOUR + 20)  # borrows 2: within the limit
    assert _started(s, HOUR + 20) == ["a-late"]
    assert {p.workload_id: p.reason for p in s.snapshot(HOUR + 20).pending} == {"a-big": "quota"}


def _value(s: Scheduler, pending: PendingWorkload) -> int:
    return s._value(pending.request)


def _violations(seed: int, rule: bool) -> list[str]:
    """Random work of three teams on four nodes for a simulated day and a half; after every
    decision, each start is checked against the team's older starving requests still queued."""
    rng = random.Random(seed)
    knobs = replace(
        KNOBS,
        starvation_after_s=2 * HOUR,
        starving_blocks_team=rule,
        max_reservations=rng.choice([0, 1]),
        starving_reservations_per_team=rng.choice([0, 1]),
    )
    s = Scheduler(policy({"a": 8, "b": 8, "c": 16}, knobs), nodes(4))
    durations: dict[str, float] = {}
    ends: dict[str, float] = {}
    preemptors: set[str] = set()
    found: list[str] = []
    now = 0.0
    for n in range(400):
        now += rng.choice([60.0, 300.0, 900.0])
        for lease in list(s.leases().values()):
            leaving = lease.state is LeaseState.PREEMPTING and (lease.stop_deadline or 0) <= now
            if leaving or ends.get(lease.lease_id, float("inf")) <= now:
                s.release(lease.lease_id, now, finished=not leaving)
        for _ in range(rng.choice([0, 0, 1, 2])):
            shape = rng.choice([(1,), (2,), (4,), (8,), (4, 4), (8, 8)])
            wid = f"{rng.choice('abc')}-{n}-{len(durations)}"
            durations[wid] = rng.uniform(600, 6 * HOUR)
            priority = rng.choice(["training", "batch", "exploratory"])
            s.submit(gang(wid, wid[0], shape, priority, checkpoint_s=900.0, same_group=len(shape) > 1), now)
        queued = {p.request.workload_id: p for p in s.pending()}
        decision = s.schedule(now)
        waiting = s.pending()
        for start in decision.starts:
            ends[start.lease_id] = now + durations[start.workload_id]
            if start.workload_id in preemptors or not start.borrowing:
                continue  # its victims already left for it; or it runs within its team's guarantee
            x = queued[start.workload_id]
            for y in waiting:
                if (
                    y.request.team == x.request.team
                    and _value(s, y) >= _value(s, x)
                    and y.submitted_at < x.submitted_at
                    and now - y.submitted_at > knobs.starvation_after_s  # type: ignore[operator]
                ):
                    found.append(f"seed {seed}: at {now:.0f} s {start.workload_id} passed {y.request.workload_id}")
        preemptors = {r.workload_id for r in decision.reservations if r.kind is HoldKind.PREEMPTOR}
    return found


@pytest.mark.parametrize("seed", range(20))
def test_no_start_passes_an_older_starving_request_of_its_team(seed: int) -> None:
    assert _violations(seed, rule=True) == []


def test_the_property_fails_without_the_rule() -> None:
    """The same generated workloads, without the rule: the check above finds overtakes."""
    assert sum(bool(_violations(seed, rule=False)) for seed in range(20)) >= 5
