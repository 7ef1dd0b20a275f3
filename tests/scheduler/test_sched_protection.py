"""Victim protection (issue 18, victim thrash): minimum runtimes against priority preemption and
reclaim, per-lease backoff after each preemption, inference reclaim exempt; and the property
that no lease is preempted inside its protection and no non-preemptible lease ever is."""

from __future__ import annotations

import random
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sched_support import ALL_CLASSES, gang, nodes

from switchyard.cli import main
from switchyard.scheduler.core import (
    PolicyKnobs,
    PreemptionMode,
    PreemptionReason,
    PriorityClass,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.core.config import PolicyFileError, load_policy_file
from tests.examples import examples

REPO = Path(__file__).resolve().parents[2]
CLASSES = (
    PriorityClass("production-inference", 1000, preemptible=False),
    PriorityClass(
        "training",
        100,
        True,
        min_runtime_s=600.0,
        reclaim_min_runtime_s=300.0,
        preemption_backoff_s=200.0,
        max_preemption_backoff_s=1600.0,
    ),
    PriorityClass(
        "batch",
        50,
        True,
        min_runtime_s=200.0,
        reclaim_min_runtime_s=100.0,
        preemption_backoff_s=100.0,
        max_preemption_backoff_s=800.0,
    ),
    PriorityClass("exploratory", 10, True, preemption_backoff_s=150.0, max_preemption_backoff_s=1200.0),
)
BY_NAME = {c.name: c for c in CLASSES}


def _policy(
    guarantees: dict[str, int], mode: PreemptionMode = PreemptionMode.CHECKPOINT_AWARE, inference_pool: bool = False
) -> SchedulerPolicy:
    teams = [Team(t, (Quota(ALL_CLASSES, g),), float(max(g, 1))) for t, g in guarantees.items()]
    if inference_pool:
        teams.append(Team("inf", (Quota(frozenset({WorkloadClass.INFERENCE}), 8, 0),), 8.0))
    # Retry searches at once, so a test sees the first instant a victim becomes eligible.
    return SchedulerPolicy(CLASSES, tuple(teams), PolicyKnobs(preemption=mode, preemption_retry_s=0.0))


def test_a_preempted_workload_backs_off_doubling_up_to_the_cap() -> None:
    """b reclaims from borrower a again and again; each restart of a's exploratory job (no
    minimum runtime) is protected longer: 150 s after one preemption, then 300, 600, and the
    1,200 s cap."""
    grace = PolicyKnobs().preemption_grace_s
    s = Scheduler(_policy({"a": 0, "b": 8}), nodes(1))
    s.submit(gang("a-exp", "a", (8,), "exploratory"), 0)
    s.schedule(0)
    restarted = 0.0
    for n, protection in enumerate([0.0, 150.0, 300.0, 600.0, 1200.0, 1200.0]):
        s.submit(gang(f"b-{n}", "b", (8,), "exploratory"), restarted)
        if protection:
            assert not s.schedule(restarted + protection - 1).notices  # backing off
        noticed = restarted + protection
        assert [x.workload_id for x in s.schedule(noticed).notices] == ["a-exp"]
        s.cancel(f"b-{n}", noticed)  # b gives up; a-exp is stopped at its deadline all the same
        stop = s.schedule(noticed + grace).stops[0]
        s.release(stop.lease_id, noticed + grace)
        restarted = noticed + grace
        assert s.schedule(restarted).starts[0].workload_id == "a-exp"


def test_reclaim_waits_for_the_reclaim_min_runtime_but_inference_does_not() -> None:
    # a's training borrows all 8 GPUs of one node; the reclaim protection of training is 300 s.
    s = Scheduler(_policy({"a": 0, "b": 4}, inference_pool=True), nodes(1))
    s.submit(gang("a-train", "a", (8,), "training"), 0)
    s.schedule(0)
    s.submit(gang("b-0", "b", (4,), "exploratory"), 100)
    assert not s.schedule(100).notices  # b reclaims, but a's lease is 100 s old
    s.submit(gang("inf-0", "inf", (1,), "production-inference"), 101)
    notices = s.schedule(101).notices
    assert [(n.workload_id, n.reason, n.preemptor) for n in notices] == [("a-train", PreemptionReason.RECLAIM, "inf-0")]


def test_priority_classes_with_meaningless_or_inverted_protection_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("priority_classes:\n  - {name: inf, value: 9, preemptible: false, min_runtime_s: 60}\n")
    with pytest.raises(PolicyFileError, match=r"priority_classes\.0.*not preemptible"):
        load_policy_file(path)
    path.write_text(
        "priority_classes:\n  - {name: t, value: 9, preemptible: true, "
        "preemption_backoff_s: 600, max_preemption_backoff_s: 60}\n"
    )
    with pytest.raises(PolicyFileError, match="max_preemption_backoff_s"):
        load_policy_file(path)


def test_policy_check_covers_the_scheduler_protection_fields(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    assert main(["policy", "check", str(policies)]) == 0
    scheduler = policies / "scheduler.yaml"
    scheduler.write_text(scheduler.read_text().replace("preemption_backoff_s: 0,", "preemption_backoff_s: -1,", 1))
    capsys.readouterr()
    assert main(["policy", "check", str(policies)]) == 1
    assert "preemption_backoff_s" in capsys.readouterr().out


# -- the property ------------------------------------------------------------------------------
SHAPES = [(1,), (2,), (4,), (8,), (4, 4)]
PRIORITIES = [c.name for c in CLASSES]
TEAMS = ["a", "b", "c", "inf"]


def _required_s(victim: str, reason: PreemptionReason, preempted_before: int) -> float:
    """The protection the test expects, computed from the rules in docs/scheduler.md."""
    cls = BY_NAME[victim]
    floor = cls.min_runtime_s if reason is PreemptionReason.PRIORITY else cls.reclaim_min_runtime_s
    backoff = 0.0
    if preempted_before and cls.preemption_backoff_s:
        backoff = min(
            cls.preemption_backoff_s * 2 ** (preempted_before - 1),
            max(cls.max_preemption_backoff_s, cls.preemption_backoff_s),
        )
    return max(floor, backoff)


def _replay_checking_protection(seed: int, mode: PreemptionMode) -> None:
    rng = random.Random(seed)
    s = Scheduler(_policy({"a": 8, "b": 8, "c": 4}, mode, inference_pool=True), nodes(4))
    requests = {}
    noticed: dict[str, int] = {}  # workload -> notices seen, counted here, not by the core
    now = 0.0
    for step in range(rng.randint(20, 90)):
        roll = rng.random()
        if roll < 0.5:
            team = rng.choice(TEAMS)
            priority = "production-inference" if team == "inf" else rng.choice(PRIORITIES)
            request = gang(
                f"{team}-{step}",
                team,
                rng.choice(SHAPES) if team != "inf" else (1,),
                priority,
                checkpoint_s=rng.choice([None, 120.0]),
            )
            requests[request.workload_id] = request
            s.submit(request, now)
        elif roll < 0.7 and s.leases():
            lease_id = rng.choice(sorted(s.leases()))
            s.release(lease_id, now, finished=True)
        else:
            now += rng.choice([1.0, 50.0, 150.0, 400.0, 1000.0])
        for _ in range(8):
            d = s.schedule(now)
            for n in d.notices:
                lease = s.leases()[n.lease_id]
                cls = BY_NAME[lease.request.priority_class]
                where = f"seed {seed} ({mode}): {n.lease_id} noticed at {now} for {n.preemptor}"
                assert cls.preemptible, f"{where}: its class is not preemptible"
                inference_reclaim = (
                    n.reason is PreemptionReason.RECLAIM
                    and requests[n.preemptor].workload_class is WorkloadClass.INFERENCE
                )
                if not inference_reclaim:
                    ran = now - lease.started_at
                    need = _required_s(cls.name, n.reason, noticed.get(n.workload_id, 0))
                    assert ran >= need, f"{where}: ran {ran} s, protected for {need} s ({n.reason})"
                noticed[n.workload_id] = noticed.get(n.workload_id, 0) + 1
            for stop in d.stops:
                s.release(stop.lease_id, now, finished=stop.reason == "cancelled")
            if not d.stops:
                break


@settings(max_examples=examples(80), deadline=None)
@given(st.integers(0, 2**31), st.sampled_from(list(PreemptionMode)))
def test_no_lease_is_preempted_inside_its_protection(seed: int, mode: PreemptionMode) -> None:
    _replay_checking_protection(seed, mode)
