"""Bounded waits (issue 18): starving gangs get reservations of their own, capped per team,
re-targeted when nodes change, and escalate to preempting strictly lower priorities after a
second bound; the property that a reserved gang starts within the documented bound."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_support import ALL_CLASSES, gang, nodes, policy

from switchyard.scheduler.core import (
    Node,
    PolicyKnobs,
    PreemptionReason,
    PriorityClass,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
)
from switchyard.scheduler.core.config import PolicyFileError, load_policy_file
from switchyard.scheduler.core.model import HoldKind
from tests.examples import examples

HOUR = 3600.0
CLASSES = (
    PriorityClass("production-inference", 1000, preemptible=False),
    PriorityClass("training", 100, True, min_runtime_s=600.0, reclaim_min_runtime_s=1800.0),
    PriorityClass("batch", 50, True, min_runtime_s=300.0, preemption_backoff_s=200.0, max_preemption_backoff_s=800.0),
    PriorityClass("exploratory", 10, True, preemption_backoff_s=300.0, max_preemption_backoff_s=1200.0),
)
KNOBS = PolicyKnobs(
    starvation_after_s=HOUR,
    starvation_preempt_after_s=2 * HOUR,
    starving_reservations_per_team=1,
    max_reservations=1,
)


def _policy(guarantees: dict[str, int], knobs: PolicyKnobs = KNOBS) -> SchedulerPolicy:
    teams = tuple(Team(t, (Quota(ALL_CLASSES, g),), float(max(g, 1))) for t, g in guarantees.items())
    return SchedulerPolicy(CLASSES, teams, knobs)


def _kinds(s: Scheduler, now: float) -> dict[str, HoldKind]:
    return {r.workload_id: r.kind for r in s.schedule(now).reservations}


def test_starving_gangs_hold_reservations_of_their_own_capped_per_team() -> None:
    # d fills both nodes with work of its own guarantee; a and b borrow, so cannot reclaim.
    s = Scheduler(_policy({"a": 0, "b": 0, "d": 16}), nodes(2))
    s.submit(gang("d-0", "d", (8,), "training"), 0)
    s.submit(gang("d-1", "d", (6,), "training"), 0)
    s.schedule(0)
    for wid, team in (("a-0", "a"), ("a-1", "a"), ("b-0", "b")):
        s.submit(gang(wid, team, (4,), "training"), 10)
    assert _kinds(s, 20) == {"a-0": HoldKind.BLOCKED_HEAD}  # one global blocked head
    kinds = _kinds(s, 10 + HOUR + 1)
    # Past an hour each team's oldest starving gang holds its own; a's second one does not.
    assert kinds == {"a-0": HoldKind.STARVING, "b-0": HoldKind.STARVING, "a-1": HoldKind.BLOCKED_HEAD}


def test_a_starving_gang_escalates_only_after_the_second_bound() -> None:
    s = Scheduler(_policy({"a": 0, "d": 16}), nodes(2))
    s.submit(gang("d-exp", "d", (8,), "exploratory"), 0)
    s.submit(gang("d-train", "d", (8,), "training"), 0)
    s.schedule(0)
    s.submit(gang("a-big", "a", (8,), "training"), 10)
    assert not s.schedule(10 + HOUR + 1).notices  # starving: reserved, d is not borrowing
    assert not s.schedule(10 + 2 * HOUR - 1).notices
    notices = s.schedule(10 + 2 * HOUR + 1).notices
    # Only strictly lower priority goes: d's exploratory lease, never its training one.
    assert [(n.workload_id, n.reason) for n in notices] == [("d-exp", PreemptionReason.PRIORITY)]
    assert _kinds(s, 10 + 2 * HOUR + 2) == {"a-big": HoldKind.PREEMPTOR}


def test_reservations_are_retargeted_when_nodes_change() -> None:
    s = Scheduler(_policy({"a": 0, "d": 16}), nodes(2))
    s.submit(gang("d-0", "d", (6,), "training"), 0)
    s.submit(gang("d-1", "d", (5,), "training"), 0)
    s.schedule(0)
    s.submit(gang("a-big", "a", (8,), "training"), 10)
    assert set(_kinds(s, 10)) == {"a-big"}
    s.add_node(Node("n9", 8, "g9", "r9"), 20)
    assert s.reservations() == {}  # dropped; chosen afresh by the next decision
    starts = s.schedule(20).starts
    assert [(x.workload_id, x.placement) for x in starts] == [("a-big", ("n9",))]


def test_escalation_must_come_after_aging(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("policy:\n  starvation_after_s: 7200\n  starvation_preempt_after_s: 3600\n")
    with pytest.raises(PolicyFileError, match="starvation_preempt_after_s"):
        load_policy_file(path)


# -- the property ------------------------------------------------------------------------------
STEP_S = 60.0  # the driver decides at least once a minute (docs: the bound assumes it)


def wait_bound_s(policy: SchedulerPolicy, gang_priority: str) -> float:
    """docs/scheduler.md, "Bounded waits": escalation bound + the longest protection of a
    strictly lower class + one grace period + one retry of the victim search."""
    knobs = policy.knobs
    mine = policy.priority(gang_priority).value
    protection = max(
        (
            max(c.min_runtime_s, c.max_preemption_backoff_s, c.preemption_backoff_s)
            for c in policy.priority_classes
            if c.preemptible and c.value < mine
        ),
        default=0.0,
    )
    assert knobs.starvation_preempt_after_s is not None
    return knobs.starvation_preempt_after_s + protection + knobs.preemption_grace_s + knobs.preemption_retry_s


def _replay_gangs(seed: int) -> None:
    """Team d keeps the cluster full of long lower-priority work within its own guarantee;
    teams a and b (no guarantee) each submit one training gang. Each must start in time."""
    rng = random.Random(seed)
    policy = _policy({"a": 0, "b": 0, "d": 32})
    s = Scheduler(policy, nodes(4))
    ends: dict[str, float] = {}  # lease -> when its work ends
    submits: list[tuple[float, str, tuple[int, ...], str]] = []
    for i in range(rng.randint(8, 30)):
        submits.append(
            (
                rng.uniform(0, 2 * HOUR),
                f"d-{i}",
                rng.choice([(1,), (2,), (4,), (8,)]),
                rng.choice(["batch", "exploratory"]),
            )
        )
    for team in ("a", "b"):
        submits.append((rng.uniform(0, 3 * HOUR), team, rng.choice([(8,), (4,), (8, 8)]), "training"))
    duration = {wid: rng.uniform(HOUR, 10 * 24 * HOUR) for _, wid, _, _ in submits}
    submitted: dict[str, float] = {}
    started: dict[str, float] = {}
    now = 0.0
    horizon = 3 * HOUR + wait_bound_s(policy, "training") + 2 * STEP_S
    while now <= horizon:
        for at, wid, shape, priority in submits:
            if now - STEP_S < at <= now:
                s.submit(gang(wid, wid.split("-")[0], shape, priority, same_group=len(shape) > 1), now)
                submitted[wid] = now
        for lease_id, end in list(ends.items()):
            if end <= now and lease_id in s.leases():
                s.release(lease_id, now, finished=True)
                del ends[lease_id]
        for _ in range(8):
            d = s.schedule(now)
            for start in d.starts:
                started.setdefault(start.workload_id, now)
                ends[start.lease_id] = now + duration[start.workload_id]
            for stop in d.stops:
                s.release(stop.lease_id, now)
                ends.pop(stop.lease_id, None)
            if not d.stops:
                break
        now += STEP_S
    bound = wait_bound_s(policy, "training")
    for team in ("a", "b"):
        assert team in started, f"seed {seed}: {team}'s gang never started (bound {bound} s)"
        waited = started[team] - submitted[team]
        assert waited <= bound + STEP_S, f"seed {seed}: {team}'s gang waited {waited} s > {bound} s"


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 2**31))
def test_a_reserved_gang_starts_within_the_documented_bound(seed: int) -> None:
    _replay_gangs(seed)


def test_without_escalation_the_same_workload_starves() -> None:
    """The bound is the escalation's doing: off, a gang waits for d's multi-day jobs."""
    off = _policy({"a": 0, "d": 8}, PolicyKnobs(starvation_after_s=HOUR, starvation_preempt_after_s=None))
    s = Scheduler(off, nodes(1))
    s.submit(gang("d-0", "d", (8,), "exploratory"), 0)
    s.schedule(0)
    s.submit(gang("a-big", "a", (8,), "training"), 10)
    assert not any(s.schedule(t).notices for t in (HOUR, 3 * HOUR, 48 * HOUR))


@pytest.mark.parametrize("seed", range(20))
def test_hold_counts_match_a_recount(seed: int) -> None:
    """`HoldCounts` is kept as holds come and go (counting every hold per blocked gang was a
    decision's largest cost at 10k GPUs); after any sequence it equals a recount."""
    import random

    from switchyard.scheduler.core.model import HoldKind
    from switchyard.scheduler.core.starvation import HoldCounts

    rng = random.Random(seed)
    counts, held = HoldCounts(), {}
    for n in range(300):
        if held and rng.random() < 0.45:
            workload = rng.choice(sorted(held))
            counts.remove(*held.pop(workload))
        else:
            held[f"w{n}"] = (rng.choice(list(HoldKind)), rng.choice("abc"))
            counts.add(*held[f"w{n}"])
        for kind in HoldKind:
            assert counts.of_kind(kind) == sum(1 for k, _ in held.values() if k is kind), f"seed {seed}"
        for team in "abc":
            assert counts.starving_of(team) == sum(
                1 for k, t in held.values() if k is HoldKind.STARVING and t == team
            ), f"seed {seed}"


def _as_pickled_before_holds(core: Scheduler, *, with_counts: bool) -> dict[str, object]:
    """`core`'s state as a version that kept its holds in its own fields pickled it (and, older
    still, without their counts)."""
    state = dict(core.__dict__)
    holds = state.pop("_holds")
    state.update(
        _reserved=holds._amounts,
        _reserved_value=holds._value,
        _hold_kind=holds._kind,
        _hold_team=holds._team,
        _waived_cache={},
        _held=holds.per_node,
        _held_free=holds._held_free,
    )
    if with_counts:
        state["_hold_counts"] = holds.counts
    return state


@pytest.mark.parametrize("with_counts", [True, False])
def test_a_core_pickled_by_an_older_version_restores_its_holds(with_counts: bool) -> None:
    """The live scheduler once journalled its core with pickle: a state written when the holds
    were the core's own fields (and, before that, without their counts) must still load, with
    the same holds, counts and GPUs left open to backfill."""
    import pickle

    core = Scheduler(policy({"a": 8, "b": 8}), nodes(2), now=0.0)
    core.submit(gang("a-1", "a", (4,), "training"), 0.0)
    core.submit(gang("b-big", "b", (8, 8), "training", same_group=True), 0.0)
    core.schedule(1.0)  # a-1 starts; b's 16-GPU gang is blocked and takes the reservation
    assert core._holds.counts.of_kind(HoldKind.BLOCKED_HEAD) == 1
    restored = Scheduler.__new__(Scheduler)
    restored.__setstate__(pickle.loads(pickle.dumps(_as_pickled_before_holds(core, with_counts=with_counts))))
    assert restored._holds.counts.of_kind(HoldKind.BLOCKED_HEAD) == 1
    assert restored.reservations() == core.reservations()
    assert set(core.reservations()) == {"b-big"}
    assert restored._holds.open_gpus() == core._holds.open_gpus()
    assert not any(name.startswith(("_reserved", "_hold_", "_held")) for name in vars(restored))
    assert pickle.loads(pickle.dumps(core))._holds.counts.of_kind(HoldKind.BLOCKED_HEAD) == 1
    # The restored core goes on deciding: the gang starts once a-1 leaves.
    lease = restored.lease_of("a-1")
    assert lease is not None
    restored.release(lease.lease_id, 2.0, finished=True)
    assert [s.workload_id for s in restored.schedule(3.0).starts] == ["b-big"]
