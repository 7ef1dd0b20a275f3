"""Every pending workload carries its reason in the core's snapshot (issue 18)."""

from __future__ import annotations

from sched_support import gang, nodes, policy

from switchyard.scheduler.core import Scheduler


def _reasons(s: Scheduler, now: float) -> dict[str, tuple[str, str]]:
    return {p.workload_id: (p.reason, p.detail) for p in s.snapshot(now).pending}


def test_capacity_and_reservation() -> None:
    # One 8-GPU node: x holds 4; big (8) cannot fit and reserves the 4 free GPUs; small (2)
    # would fit on them but they are held for big.
    s = Scheduler(policy({"a": 16}), nodes(1))
    s.submit(gang("x", "a", (4,)), 0)
    s.schedule(0)
    s.submit(gang("big", "a", (8,)), 1)
    s.schedule(1)
    s.submit(gang("small", "a", (2,)), 2)
    s.schedule(2)
    reasons = _reasons(s, 2)
    assert reasons["big"] == ("capacity", "needs 8 GPUs, 4 free")
    assert reasons["small"][0] == "reservation"


def test_a_gang_larger_than_the_cluster_says_so() -> None:
    """Found replaying a trace with a 64-GPU job on 16 GPUs (stop 44): its reason read "no
    lendable capacity", as if other teams held the GPUs it needed. It waits, because an
    autoscaler may add nodes (`waiting_for_capacity`), and says why."""
    s = Scheduler(policy({"a": 64}), nodes(2))
    s.submit(gang("huge", "a", (8,) * 8), 0)
    s.schedule(0)
    assert _reasons(s, 0)["huge"] == (
        "capacity",
        "larger than the cluster: needs 64 GPUs, it has 16 GPUs; waits for nodes to be added",
    )
    assert [need.request.workload_id for need in s.waiting_for_capacity()] == ["huge"]


def test_gang_fit_and_queue_order() -> None:
    # Two 8-GPU nodes with 6 used on each: 4 GPUs are free, but no node holds a 4-GPU bundle.
    s = Scheduler(policy({"a": 32}), nodes(2))
    s.submit(gang("x", "a", (6,)), 0)
    s.submit(gang("y", "a", (6,)), 0)
    s.schedule(0)
    s.submit(gang("wide", "a", (4,)), 1)
    s.schedule(1)
    s.submit(gang("tiny", "a", (1,)), 1)  # submitted since the last decision: it fits now
    reasons = _reasons(s, 1)
    assert reasons["wide"] == ("gang fit", "4 GPUs free, not as bundles 4")
    assert reasons["tiny"] == ("queue order", "fits now")


def test_quota() -> None:
    s = Scheduler(policy({"a": 2}), nodes(1))
    s.submit(gang("serve", "a", (4,), "production-inference"), 0)  # may not borrow
    s.schedule(0)
    assert _reasons(s, 0)["serve"] == ("quota", "over guarantee and may not borrow")
    assert s.snapshot(5).pending[0].waited_s == 5


def test_a_snapshot_for_the_gauges_skips_the_per_workload_reasons() -> None:
    """Explaining costs a placement search per pending workload: the per-tick gauges ask for
    counts only, and still get every team's queue."""
    s = Scheduler(policy({"a": 4}), nodes(1))
    s.submit(gang("a-1", "a", (8,), "training"), 0.0)
    counts = s.snapshot(1.0, explain_pending=False)
    full = s.snapshot(1.0)
    assert counts.pending == () and len(full.pending) == 1
    assert [t.queued for t in counts.teams] == [t.queued for t in full.teams]
