"""Token buckets: burst to the per-minute limit, refill steadily, all or nothing across keys."""

from __future__ import annotations

import pytest

from switchyard.budgets.ratelimit import PermitDemand, PermitsGranted, PermitsRefused, TokenBuckets


def test_burst_then_refill_with_retry_after() -> None:
    b = TokenBuckets()
    for _ in range(60):
        assert isinstance(b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 0.0), PermitsGranted)
    refused = b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 0.0)
    assert isinstance(refused, PermitsRefused)
    assert refused.retry_after_s == pytest.approx(1.0)  # 60/min refills one per second
    assert isinstance(b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 1.0), PermitsGranted)


def test_all_or_nothing_across_keys_and_batches() -> None:
    b = TokenBuckets()
    b.take((PermitDemand("flow:t/f:tpm", 100, 100, 100),), 0.0)
    refused = b.take((PermitDemand("team:t:rpm", 10, 1, 1), PermitDemand("flow:t/f:tpm", 100, 50, 50)), 0.0)
    assert isinstance(refused, PermitsRefused) and refused.key == "flow:t/f:tpm"
    assert refused.retry_after_s == pytest.approx(30.0)
    granted = b.take((PermitDemand("team:t:rpm", 10, 1, 5),), 0.0)  # the rpm bucket was untouched
    assert granted == PermitsGranted({"team:t:rpm": 5})
    b.give_back({"team:t:rpm": 4}, {"team:t:rpm": 10}, 0.0)
    assert b.take((PermitDemand("team:t:rpm", 10, 9, 9),), 0.0) == PermitsGranted({"team:t:rpm": 9})


def test_more_than_a_minute_of_tokens_never_fits() -> None:
    refused = TokenBuckets().take((PermitDemand("flow:t/f:tpm", 100, 101, 101),), 0.0)
    assert isinstance(refused, PermitsRefused)


@pytest.mark.parametrize("step_s", [-1.0, -3_600.0, -86_400.0])
def test_a_clock_stepped_back_drains_no_bucket(step_s: float) -> None:
    """Stop 47: the ledger's wall clock stepping back an hour (NTP) drained a bucket by an
    hour's refill, so its key was refused for the next hour (`retry_after_s` 3,542)."""
    b = TokenBuckets()
    assert isinstance(b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 1000.0), PermitsGranted)
    after_step = b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 1000.0 + step_s)
    assert after_step == PermitsGranted({"team:t:rpm": 1}, {"team:t:rpm": 58})
    assert isinstance(b.take((PermitDemand("team:t:rpm", 60, 58, 58),), 1000.0 + step_s), PermitsGranted)
    assert isinstance(b.take((PermitDemand("team:t:rpm", 60, 1, 1),), 1000.0 + step_s + 1), PermitsGranted)
