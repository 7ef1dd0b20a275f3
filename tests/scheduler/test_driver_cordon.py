"""Operators' cordon, uncordon and drain of a node, on the pure driver (no Ray): no new lease on a
cordoned node, its leases run on, a drain notices what may move and reports what blocks it, and
the cordon is durable (write-ahead-log replay, snapshots, Ray's node refreshes)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from driver_support import GRACE_S, admit, as_version_3, as_version_4, details, driver, journal, of, submission
from sched_support import nodes, policy

from switchyard.scheduler.api import ReleaseOutcome, StopReason, WorkloadSubmission
from switchyard.scheduler.claims import ClaimPolicy
from switchyard.scheduler.core import DEFAULT_PRIORITY_CLASSES, LeaseState, Node, PriorityClass, WorkloadClass
from switchyard.scheduler.driver import Driver, inputs, views
from switchyard.scheduler.driver.effects import SendNotice, StopLaunchedJob
from switchyard.scheduler.driver.node_cordons import DrainBlocker, NodeLookupError
from switchyard.scheduler.driver.snapshot import SCHEMA_VERSION, from_document, to_document
from switchyard.scheduler.driver.state import LaunchedJob


def node_of(d: Driver, workload: str) -> str:
    grant = d.lease(workload)
    assert grant is not None, f"{workload} holds no lease"
    return grant.placements[0].node_id


def row(d: Driver, node: str) -> dict[str, object]:
    [found] = [r for r in views.node_rows(d.state) if r["node_id"] == node]
    return found


def test_no_new_lease_lands_on_a_cordoned_node() -> None:
    d = driver({"a": 16}, node_count=2)
    assert d.cordon("n0", 0.0)[0] == "n0"
    assert journal(d.cordon("n0", 0.5)[1]) == []  # cordoning twice is harmless
    admit(d, submission("w1", "a", 8), 1)
    assert node_of(d, "w1") == "n1"
    d.submit(submission("w2", "a", 8), 2)
    d.tick(3)
    assert d.lease("w2") is None  # n0 has 8 GPUs free, but it is cordoned
    assert row(d, "n0")["state"] == "cordoned" and row(d, "n0")["free_gpus"] == 8
    assert row(d, "n1")["state"] == "ready"


def test_uncordon_lets_placements_back() -> None:
    d = driver({"a": 8}, node_count=1)
    d.cordon("n0", 0.0)
    d.submit(submission("w", "a", 8), 1)
    d.tick(2)
    assert d.lease("w") is None
    name, effects = d.uncordon("n0", 3)
    assert name == "n0" and journal(effects) == ["node_uncordoned"]
    d.tick(4)
    assert node_of(d, "w") == "n0"
    assert row(d, "n0")["state"] == "ready"


def test_existing_leases_run_on_through_a_cordon() -> None:
    d = driver({"a": 8}, node_count=1)
    grant = admit(d, submission("w", "a", 8), 0)
    _, effects = d.cordon("n0", 1)
    assert journal(effects) == ["node_cordoned"] and details(effects, "node_cordoned", "") == {"node": "n0"}
    for now in (2, 2 + GRACE_S, 10_000):
        assert not of(d.tick(now), SendNotice)
    assert d.lease("w") == grant and d.notice("w") is None
    assert row(d, "n0")["leases"] == [
        {
            "workload_id": "w",
            "team": "a",
            "priority_class": "training",
            "gpus": 8,
            "state": "running",
            "blocks_drain": None,
        }
    ]
    assert d.release(grant.lease_id, True, 10_001)[0] is ReleaseOutcome.RELEASED
    assert row(d, "n0")["free_gpus"] == 8 and row(d, "n0")["state"] == "cordoned"


def test_a_preemptor_takes_no_victim_on_a_cordoned_node() -> None:
    """Room made on a cordoned node would be room nobody may use."""
    d = driver({"a": 16}, node_count=2)
    admit(d, submission("e0", "a", 8, "exploratory"), 0)
    admit(d, submission("e1", "a", 8, "exploratory"), 1)
    d.cordon(node_of(d, "e1"), 2)
    d.submit(submission("t", "a", 8, "training"), 3)
    noticed = [e.notice.job_id for e in of(d.tick(4), SendNotice)]
    assert noticed == ["e0"]


def test_drain_notices_each_preemptible_lease_and_requeues_it_elsewhere() -> None:
    d = driver({"a": 16}, node_count=2)
    grant = admit(d, submission("w", "a", 8, entrypoint="run"), 0)
    d.job_launched("w", "w-1")
    node = grant.placements[0].node_id
    report, effects = d.drain(node, False, 10)
    assert (report.node, report.noticed, report.leaving, report.blocking) == (node, ("w",), (), ())
    [sent] = of(effects, SendNotice)
    assert sent.notice.job_id == "w" and sent.notice.reason == f"drain for node {node}"
    assert (sent.notice.deadline, sent.notice.sent_at, sent.notice.lease_id) == (10 + GRACE_S, 10, grant.lease_id)
    assert d.notice("w") is sent.notice
    assert journal(effects) == ["node_drained", "preemption_notice"]
    assert d.state.core.lease_of("w").state is LeaseState.PREEMPTING  # type: ignore[union-attr]
    assert row(d, node)["state"] == "draining"
    # It checkpoints and releases unfinished: requeued, and admitted again on the other node.
    assert d.release(grant.lease_id, False, 20)[0] is ReleaseOutcome.REQUEUED
    d.tick(21)
    assert node_of(d, "w") != node and d.state.attempts["w"] == 2
    assert d.state.claim_timeouts == {}  # not a failure of the workload
    assert row(d, node)["state"] == "drained"


def test_a_drained_lease_that_misses_its_deadline_is_stopped_for_the_drain_and_requeued() -> None:
    d = driver({"a": 16}, node_count=2)
    grant = admit(d, submission("w", "a", 8, entrypoint="run"), 0)
    d.job_launched("w", "w-1")
    d.drain(grant.placements[0].node_id, False, 10)
    effects = d.tick(10 + GRACE_S)
    assert of(effects, StopLaunchedJob) == [StopLaunchedJob(LaunchedJob("w", "w-1"), "a", StopReason.DRAIN)]
    assert "requeued" in journal(effects, "w")
    d.tick(11 + GRACE_S)
    assert node_of(d, "w") != grant.placements[0].node_id


def critical_driver() -> Driver:
    """One node, and a non-preemptible training priority class."""
    base = policy({"a": 8, "serve": 8})
    classes = (*DEFAULT_PRIORITY_CLASSES, PriorityClass("critical", 500, preemptible=False))
    d = Driver.empty(replace(base, priority_classes=classes), 0.0)
    d.nodes_seen(nodes(2), 0.0)
    return d


def test_drain_reports_non_preemptible_leases_and_serve_replicas_as_blocking() -> None:
    d = critical_driver()
    admit(d, WorkloadSubmission(workload_id="c", team="a", priority_class="critical", bundles=(4,)), 0)
    node = node_of(d, "c")
    replica = WorkloadSubmission(
        workload_id="serve:r",
        team="serve",
        workload_class=WorkloadClass.INFERENCE,
        priority_class="production-inference",
        bundles=(4,),
    )
    admit(d, replica, 1)
    assert node_of(d, "serve:r") == node  # packed onto the same node
    report, effects = d.drain(node[:2], False, 5)  # a prefix names the node
    assert report.noticed == () and not of(effects, SendNotice)
    assert [b.workload_id for b in report.blocking] == ["c", "serve:r"]
    assert "not preemptible (--force notices it too)" in report.blocking[0].reason
    assert row(d, node)["state"] == "draining"
    assert row(d, node)["leases"][0]["blocks_drain"] == report.blocking[0].reason  # type: ignore[index]
    # --force notices the non-preemptible lease; a Serve replica still blocks.
    forced, effects = d.drain(node, True, 6)
    assert forced.noticed == ("c",) and [e.notice.job_id for e in of(effects, SendNotice)] == ["c"]
    assert forced.blocking == (DrainBlocker("serve:r", report.blocking[1].reason),)
    assert d.drain(node, True, 7)[0].leaving == ("c",)


def test_a_retried_drain_sends_no_notice_twice() -> None:
    d = driver({"a": 16}, node_count=2)
    admit(d, submission("w", "a", 8), 0)
    node = node_of(d, "w")
    first = inputs.apply(d, inputs.drain(node, False, 1.0, "r1"))
    again = inputs.apply(d, inputs.drain(node, False, 2.0, "r1"))
    assert of(first[1], SendNotice) and again[1] == []
    assert again[0].leaving == ("w",)  # type: ignore[union-attr]
    assert inputs.apply(d, inputs.cordon("n1", 3.0, "r2"))[0] == "n1"
    assert inputs.apply(d, inputs.cordon("zz", 4.0, "r2")) == ("n1", [])  # answered, not looked up again


def test_unknown_and_ambiguous_node_names_are_one_line_errors() -> None:
    d = Driver.empty(policy({"a": 8}), 0.0)
    d.nodes_seen([Node(n, 8, "g", "r") for n in ("5f3a01", "5f3a02", "9c00")], 0.0)
    with pytest.raises(NodeLookupError, match=r"^unknown node 'zz': no node id starts with it"):
        d.cordon("zz", 1)
    ambiguous = r"^node '5f3a' is ambiguous: 2 node ids start with it \(5f3a01, 5f3a02\)$"
    with pytest.raises(NodeLookupError, match=ambiguous):
        d.drain("5f3a", False, 1)
    with pytest.raises(NodeLookupError, match="unknown node ''"):
        d.uncordon("", 1)
    assert d.cordon("9c", 1)[0] == "9c00" and d.cordon("5f3a02", 2)[0] == "5f3a02"
    assert d.state.answered == {}  # refused calls leave no trace; these had no request id


def test_a_refresh_of_the_node_set_keeps_the_cordon_and_a_returning_node_is_still_cordoned() -> None:
    d = driver({"a": 16}, node_count=2)
    d.cordon("n0", 0)
    d.nodes_seen(nodes(2), 1)  # Ray reports the same nodes
    d.nodes_seen([nodes(2)[1]], 2)  # n0 leaves ...
    assert row(d, "n0")["alive"] is False and row(d, "n0")["state"] == "cordoned"
    d.nodes_seen(nodes(2), 3)  # ... and comes back
    for i in range(2):
        d.submit(submission(f"w{i}", "a", 8), 4)
    d.tick(5)
    assert node_of(d, "w0") == "n1" and d.lease("w1") is None
    d.uncordon("n0", 6)  # what the hold took is given back exactly
    d.tick(7)
    assert node_of(d, "w1") == "n0"


def test_a_cordon_survives_replay_of_the_write_ahead_log() -> None:
    records = [
        inputs.nodes_seen(nodes(2), 0.0),
        inputs.cordon("n0", 1.0, "r1"),
        inputs.submit(submission("w0", "a", 8), 2.0, "r2"),
        inputs.submit(submission("w1", "a", 8), 2.0, "r3"),
        inputs.tick(3.0),
    ]
    replayed = Driver.empty(policy({"a": 16}), 0.0)
    for record in json.loads(json.dumps(records)):  # as the log holds them
        inputs.apply(replayed, record)
    assert set(replayed.state.cordons) == {"n0"}
    assert node_of(replayed, "w0") == "n1" and replayed.lease("w1") is None


def test_a_cordon_survives_a_snapshot_round_trip() -> None:
    d = driver({"a": 16}, node_count=2)
    d.drain("n0", False, 1.0)
    doc = json.loads(json.dumps(to_document(d.state, 7, 2.0)))
    restored = Driver(from_document(doc, "s.json").state)
    assert restored.state.cordons == d.state.cordons and row(restored, "n0")["state"] == "drained"
    for i in range(2):
        restored.submit(submission(f"w{i}", "a", 8), 3)
    restored.tick(4)
    assert node_of(restored, "w0") == "n1" and restored.lease("w1") is None  # the core's hold came back too


def test_a_snapshot_from_before_cordons_loads_with_no_node_cordoned() -> None:
    d = driver({"a": 16}, node_count=2)
    doc = json.loads(json.dumps(to_document(d.state, 3, 2.0)))
    assert doc["schema_version"] == SCHEMA_VERSION
    del doc["state"]["v"]["cordons"]  # what version 1 wrote
    snap = from_document({**as_version_3(doc), "schema_version": 1}, "old.json")
    assert snap.state.cordons == {} and snap.wal_seq == 3
    restored = Driver(snap.state)
    restored.cordon("n0", 3)
    admit(restored, submission("w", "a", 8), 4)
    assert node_of(restored, "w") == "n1"


def one_group_of_three(guarantees: dict[str, int]) -> Driver:
    """Nodes n0, n1, n2 (8 GPUs each), all in node group g0."""
    d = Driver.empty(policy(guarantees), 0.0, ClaimPolicy(timeout_s=1e9))
    d.nodes_seen(nodes(3, per_group=3), 0.0)
    return d


def two_node_gang(wid: str, team: str, priority: str = "training") -> WorkloadSubmission:
    return submission(wid, team, 8, priority).model_copy(update={"bundles": (8, 8), "same_node_group": True})


def test_a_busy_cordoned_node_takes_no_room_from_the_rest_of_its_node_group() -> None:
    """Two nodes of g0 are free and a gang needs two nodes of one group: the third node, busy
    and cordoned, must not count its leased GPUs against them (a reservation's would; a cordon
    holds no gang's place). It did, and the gang waited until the cordoned node emptied."""
    d = one_group_of_three({"a": 24})
    busy = node_of(d, admit(d, submission("busy", "a", 8), 0).workload_id)
    d.cordon(busy, 1)
    d.submit(two_node_gang("gang", "a"), 2)
    d.tick(3)
    grant = d.lease("gang")
    assert grant is not None and {p.node_id for p in grant.placements} == {"n0", "n1", "n2"} - {busy}


def test_a_gang_preempts_for_room_beside_a_busy_cordoned_node() -> None:
    """The same, when the room must be made: exploratory jobs fill the two other nodes, and a
    training gang preempts them (past their min-runtime). The cordoned node's job is no
    victim (training, as the gang), so only the two nodes' victims free room."""
    d = one_group_of_three({"a": 24})
    busy = node_of(d, admit(d, submission("own", "a", 8), 0).workload_id)
    admit(d, submission("e0", "a", 8, "exploratory"), 1)
    admit(d, submission("e1", "a", 8, "exploratory"), 2)
    d.cordon(busy, 3)
    later = 100_000.0  # past every min-runtime
    d.submit(two_node_gang("gang", "a"), later)
    noticed = sorted(e.notice.job_id for e in of(d.tick(later), SendNotice))
    assert noticed == ["e0", "e1"]
    for wid in noticed:
        d.release(d.state.core.lease_of(wid).lease_id, False, later + 1)  # type: ignore[union-attr]
    d.tick(later + 2)
    grant = d.lease("gang")
    assert grant is not None and {p.node_id for p in grant.placements} == {"n0", "n1", "n2"} - {busy}


def test_a_version_4_snapshot_marks_its_cordoned_nodes_in_the_pool() -> None:
    """Version 4 merged a cordon into the core's holds; the pool learns which nodes are
    cordoned from the state's cordons (those in the pool: one away from the cluster is not)."""
    d = Driver.empty(policy({"a": 24}), 0.0, ClaimPolicy(timeout_s=1e9))
    d.nodes_seen(nodes(4, per_group=3), 0.0)  # n0-n2 in g0, n3 in g1
    busy = node_of(d, admit(d, submission("busy", "a", 8), 0).workload_id)
    d.cordon(busy, 1)
    d.cordon("n3", 1)
    d.nodes_seen(nodes(3, per_group=3), 1.5)  # n3 away: cordoned for its return, not in the pool
    current = json.loads(json.dumps(to_document(d.state, 7, 2.0)))
    old = {**as_version_4(current), "schema_version": 4}
    assert '"_cordoned"' not in json.dumps(old)
    snap = from_document(old, "old.json")
    assert snap.state.core.pool.cordoned() == {busy}
    assert json.loads(json.dumps(to_document(snap.state, 7, 2.0))) == current
    restored = Driver(snap.state)
    restored.submit(two_node_gang("gang", "a"), 3)
    restored.tick(4)
    assert restored.lease("gang") is not None
