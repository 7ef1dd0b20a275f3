"""Enforcement's comparison of what each Ray job holds with what its leases grant."""

from __future__ import annotations

from switchyard.cluster.enforcement import JobHoldings, compare_with_leases


def test_unleased_and_over_lease_holders_are_told_apart() -> None:
    by_job = {
        "rogue": JobHoldings("rogue", gpus=2),
        "fair": JobHoldings("fair", gpus=8),
        "greedy": JobHoldings("greedy", gpus=6),
        "idle": JobHoldings("idle", gpus=0),
    }
    unleased, over = compare_with_leases(by_job, {"fair": 8, "greedy": 4, "idle": 2})
    assert [h.job_id for h in unleased] == ["rogue"]
    assert [(o.holding.job_id, o.leased_gpus, o.excess_gpus) for o in over] == [("greedy", 4, 2.0)]
