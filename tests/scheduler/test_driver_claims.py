"""Claims, claim timeouts with their three strikes, and launches that fail. No Ray."""

from __future__ import annotations

from driver_support import details, driver, journal, of, submission

from switchyard.scheduler.api import LeaseGrant, StopReason
from switchyard.scheduler.driver import Driver
from switchyard.scheduler.driver.effects import Diagnostic, SaveState, StopLaunchedJob
from switchyard.scheduler.driver.state import LaunchedJob

TIMEOUT_S = 100.0


def granted(d: Driver, wid: str, now: float) -> LeaseGrant:
    d.tick(now)
    grant = d.lease(wid)
    assert grant is not None
    return grant


def test_a_claim_records_the_job_once() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8), 0)
    assert d.claim("j", "job") == (None, [])  # nothing granted yet
    grant = granted(d, "j", 0)
    assert d.claim("j", "job") == (grant, [SaveState()])
    assert d.claim("j", "job") == (grant, [])
    assert d.state.claims == {"j": "job"}


def test_an_unclaimed_grant_goes_back_and_the_workload_is_requeued() -> None:
    d = driver({"a": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("j", "a", 8), 0)
    first = granted(d, "j", 0)
    assert d.tick(TIMEOUT_S) == []  # not past the timeout yet
    effects = d.tick(TIMEOUT_S + 1)
    assert effects[0] == SaveState() and journal(effects) == ["claim_timeout", "requeued"]
    assert details(effects, "claim_timeout", "j") == {"lease_id": first.lease_id, "outcome": "requeue"}
    assert details(effects, "requeued", "j") == {"lease_id": first.lease_id, "reason": "claim_timeout"}
    assert d.state.claim_timeouts == {"j": 1} and d.state.core.pool.free_gpus == 8
    again = granted(d, "j", TIMEOUT_S + 2)
    assert again.lease_id != first.lease_id and again.lease_id.endswith("#2")


def test_three_unclaimed_grants_in_a_row_end_the_workload() -> None:
    d = driver({"a": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("j", "a", 8), 0)
    kinds: list[str] = []
    now = 0.0
    for _ in range(3):
        granted(d, "j", now)
        now += TIMEOUT_S + 1
        kinds += journal(d.tick(now))
    assert kinds == ["claim_timeout", "requeued"] * 2 + ["claim_timeout", "ended"]
    assert d.lease("j") is None and d.state.core.pending_count() == 0 and d.state.claim_timeouts == {}
    assert d.tick(now + 1) == []


def test_a_claim_resets_the_strikes_and_a_claimed_grant_never_times_out() -> None:
    d = driver({"a": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("j", "a", 8), 0)
    granted(d, "j", 0)
    d.tick(TIMEOUT_S + 1)
    granted(d, "j", TIMEOUT_S + 2)
    d.claim("j", "job")
    assert d.state.claim_timeouts == {}
    assert d.tick(10 * TIMEOUT_S) == [] and d.lease("j") is not None


def test_inference_is_placed_not_claimed_and_never_times_out() -> None:
    d = driver({"prod": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("serve", "prod", 8, "production-inference"), 0)
    granted(d, "serve", 0)
    assert d.tick(10 * TIMEOUT_S) == [] and d.lease("serve") is not None


def test_a_launch_that_started_after_its_grant_timed_out_is_stopped() -> None:
    d = driver({"a": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    granted(d, "j", 0)
    d.job_launched("j", "j-1")  # it never claims (its runtime env took too long)
    effects = d.tick(TIMEOUT_S + 1)
    assert of(effects, StopLaunchedJob) == [StopLaunchedJob(LaunchedJob("j", "j-1"), "a", StopReason.CLAIM_TIMEOUT)]
    assert "j" not in d.state.launched


def test_a_failed_launch_is_journaled_and_its_grant_left_to_the_claim_timeout() -> None:
    """Taking the grant back at once would spend the three strikes within a second of ticks, so
    a Jobs API down for a few seconds would end the workload."""
    d = driver({"a": 8}, claim_timeout_s=TIMEOUT_S)
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    grant = granted(d, "j", 0)
    effects = d.launch_failed("j", grant.lease_id, "RuntimeError: dashboard down", 1)
    assert journal(effects) == ["launch_failed"] and SaveState() not in effects
    failed = details(effects, "launch_failed", "j")
    assert failed == {"lease_id": grant.lease_id, "error": "RuntimeError: dashboard down"}
    assert d.lease("j") == grant and d.tick(2) == []
    assert journal(d.tick(TIMEOUT_S + 1)) == ["claim_timeout", "requeued"]


def test_a_failed_launch_of_a_lease_that_ended_meanwhile_is_only_noted() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    grant = granted(d, "j", 0)
    assert d.launch_failed("j", "j#old", "boom", 1) == [
        Diagnostic("launch of workload j on lease j#old failed (boom); ended since")
    ]
    assert d.lease("j") == grant
