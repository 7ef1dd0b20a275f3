"""Releases: finished or requeued, what the job is told, and the same answer for a repeated call."""

from __future__ import annotations

from driver_support import admit, details, driver, journal, submission

from switchyard.scheduler.api import ReleaseOutcome
from switchyard.scheduler.driver.effects import Diagnostic, SaveState
from switchyard.scheduler.driver.state import LiveState


def test_a_finished_release_frees_the_gpus_and_forgets_the_lease() -> None:
    d = driver({"a": 8})
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    d.tick(0)
    d.job_launched("j", "j-1")
    grant = d.lease("j")
    assert grant is not None
    d.claim("j", "raysubmit_1")
    outcome, effects = d.release(grant.lease_id, True, 10)
    assert outcome is ReleaseOutcome.RELEASED and effects[0] == SaveState()
    assert journal(effects) == ["released"] and details(effects, "released", "j") == {"lease_id": grant.lease_id}
    assert d.lease("j") is None and "j" not in d.state.claims and "j" not in d.state.launched
    assert d.state.core.pool.free_gpus == 8 and d.state.core.pending_count() == 0


def test_a_noticed_job_releasing_unfinished_is_requeued_and_keeps_its_launch() -> None:
    d = driver({"a": 0, "b": 8})
    d.submit(submission("a0", "a", 8, entrypoint="run"), 0)
    d.tick(0)
    d.job_launched("a0", "a0-1")
    grant = d.lease("a0")
    assert grant is not None
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    outcome, effects = d.release(grant.lease_id, False, 60)
    assert outcome is ReleaseOutcome.REQUEUED and journal(effects) == ["requeued"]
    assert d.notice("a0") is None and d.state.queued_since["a0"] == 60
    assert d.state.launched["a0"].submission_id == "a0-1"  # the next admission launches it again


def test_a_repeated_release_gets_the_first_answer() -> None:
    """Ray replays calls in flight when the actor restarts, and clients retry: a repeat used to
    say "not requeued", and a requeued job believed it had finished."""
    d = driver({"a": 0, "b": 8})
    grant = admit(d, submission("a0", "a", 8), 0)
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    assert d.release(grant.lease_id, False, 60)[0] is ReleaseOutcome.REQUEUED
    assert d.release(grant.lease_id, False, 61) == (ReleaseOutcome.REQUEUED, [])
    assert d.release(grant.lease_id, True, 62) == (ReleaseOutcome.REQUEUED, [])


def test_an_unknown_lease_is_released_as_finished() -> None:
    d = driver({"a": 8})
    outcome, effects = d.release("nobody#1", True, 0)
    assert outcome is ReleaseOutcome.RELEASED and effects == [SaveState()]
    assert d.state.released == {"nobody#1": False}


def test_an_ended_lease_of_a_workload_the_core_no_longer_knows_is_only_noted() -> None:
    # Every way a workload ends forgets its ended leases; this guards a journal from before that.
    d = driver({"a": 8})
    d.state.ended["gone#1"] = "gone"
    outcome, effects = d.release("gone#1", True, 4)
    assert outcome is ReleaseOutcome.RELEASED
    assert effects == [SaveState(), Diagnostic("workload gone of ended lease gone#1 is gone already", warning=False)]
    assert d.state.ended == {}


def test_only_the_latest_releases_are_remembered() -> None:
    state = LiveState(driver({"a": 8}).state.core)
    for i in range(5):
        state.remember_release(f"l{i}", i % 2 == 0, keep=3)
    assert state.released == {"l2": True, "l3": False, "l4": True}


def test_a_lease_is_found_by_its_id_for_a_workload_whose_id_holds_a_hash() -> None:
    d = driver({"a": 8})
    grant = admit(d, submission("sweep#trial#3", "a", 8), 0)
    assert grant.lease_id == "sweep#trial#3#1"
    assert d.state.workload_of(grant.lease_id) == "sweep#trial#3"
    assert d.state.workload_of("sweep#trial#3#2") is None  # not its current lease
    assert d.state.workload_of("sweep#trial#1") is None
