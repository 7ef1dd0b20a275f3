"""Claim timeouts: which grants are late, and when a workload stops being requeued."""

from __future__ import annotations

from switchyard.scheduler.api import LeaseGrant, Placement
from switchyard.scheduler.claims import ClaimOutcome, ClaimPolicy, after_timeout, unclaimed


def grant(workload: str, at: float) -> LeaseGrant:
    placement = Placement(node_id="n1", node_group="a", gpus=4)
    return LeaseGrant(
        lease_id=f"{workload}#1",
        workload_id=workload,
        team="t",
        placements=(placement,),
        granted_at=at,
        borrowing=False,
    )


def test_only_unclaimed_grants_past_the_timeout_of_workloads_that_claim_are_late() -> None:
    times = (("old", 0.0), ("older", -5.0), ("young", 95.0), ("claimed", 0.0), ("serve", 0.0))
    grants = {w: grant(w, at) for w, at in times}
    late = unclaimed(grants, {"claimed": "job"}, lambda w: w != "serve", now=100.0, policy=ClaimPolicy(timeout_s=10))
    assert late == ["older", "old"]


def test_a_workload_is_requeued_until_its_last_allowed_timeout() -> None:
    policy = ClaimPolicy(max_timeouts=3)
    outcomes = [after_timeout(n, policy) for n in range(3)]
    assert outcomes == [ClaimOutcome.REQUEUE, ClaimOutcome.REQUEUE, ClaimOutcome.END]
