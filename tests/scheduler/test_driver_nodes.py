"""The node set Ray reports: nodes join, and a lost node's leases are requeued. No Ray."""

from __future__ import annotations

from driver_support import admit, details, driver, journal, of, submission
from sched_support import nodes

from switchyard.scheduler.api import ReleaseOutcome, StopReason
from switchyard.scheduler.driver.effects import Diagnostic, LaunchJob, SaveState, StopLaunchedJob
from switchyard.scheduler.driver.state import LaunchedJob


def test_new_nodes_join_and_an_unchanged_set_changes_nothing() -> None:
    d = driver({"a": 16}, node_count=1)
    effects = d.nodes_seen(nodes(2), 5)
    assert effects == [SaveState()] and d.state.core.pool.total_gpus == 16
    assert set(d.state.nodes) == {"n0", "n1"}
    assert d.nodes_seen(reversed(nodes(2)), 6) == []


def test_a_launched_job_on_a_lost_node_is_stopped_requeued_and_launched_again() -> None:
    d = driver({"a": 16}, node_count=2)
    d.submit(submission("j", "a", 8, entrypoint="run"), 0)
    d.tick(0)
    d.job_launched("j", "j-1")
    grant = d.lease("j")
    assert grant is not None
    lost = grant.placements[0].node_id
    effects = d.nodes_seen([n for n in nodes(2) if n.name != lost], 10)
    assert effects[0] == SaveState()
    assert Diagnostic(f"node {lost} left the cluster; leases ['{grant.lease_id}'] requeued") in effects
    # Its workers on other nodes would keep their GPUs, and its driver would run on.
    assert of(effects, StopLaunchedJob) == [StopLaunchedJob(LaunchedJob("j", "j-1"), "a", StopReason.NODE_LOST)]
    assert journal(effects) == ["node_lost"] and details(effects, "node_lost", "j") == {"node": lost}
    assert d.lease("j") is None and d.state.ended == {} and d.state.queued_since["j"] == 10
    [relaunch] = of(d.tick(11), LaunchJob)
    again = d.lease("j")
    assert again is not None and again.placements[0].node_id != lost
    assert relaunch.attempt == 2 and relaunch.lease_id == again.lease_id


def test_a_job_that_polled_for_its_lease_on_a_lost_node_says_whether_it_comes_back() -> None:
    d = driver({"a": 16}, node_count=2)
    grant = admit(d, submission("j", "a", 8), 0)
    d.claim("j", "raysubmit_1")
    effects = d.nodes_seen([n for n in nodes(2) if n.name != grant.placements[0].node_id], 10)
    assert not of(effects, StopLaunchedJob)  # not the scheduler's to relaunch: the job waits itself
    assert d.state.ended == {grant.lease_id: "j"} and "j" not in d.state.claims
    assert d.release(grant.lease_id, False, 12)[0] is ReleaseOutcome.REQUEUED
    assert d.state.core.pending()[0].request.workload_id == "j"


def test_a_lost_node_without_leases_only_shrinks_the_cluster() -> None:
    d = driver({"a": 16}, node_count=2)
    effects = d.nodes_seen(nodes(1), 3)
    assert effects == [SaveState(), Diagnostic("node n1 left the cluster; leases [] requeued")]
    assert d.state.core.pool.total_gpus == 8 and set(d.state.nodes) == {"n0"}
