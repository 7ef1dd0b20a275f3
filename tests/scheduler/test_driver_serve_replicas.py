"""Serve's GPU replicas reach the core as logged driver events (`serve_replicas`): the tally
follows them, a replay of the log rebuilds them without a snapshot, and a change that no longer
fits the state does nothing. No Ray."""

from __future__ import annotations

import json
from pathlib import Path

from driver_support import driver, journal, submission

from switchyard.cluster.scheduler_wal import WriteAheadLog, read_records
from switchyard.scheduler.core.state_codec import encode_state
from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.effects import Diagnostic
from switchyard.scheduler.driver.serve_replicas import ReplicaAction, ReplicaChange
from switchyard.scheduler.driver.tally import TeamGpus


def replica(wid: str, team: str = "a", gpus: int = 1) -> ReplicaChange:
    return ReplicaChange(
        ReplicaAction.QUEUE, wid, submission(wid, team, gpus, "production-inference"), app=f"{team}--app"
    )


def adopt(wid: str, node: str, team: str = "a", gpus: int = 1) -> ReplicaChange:
    sub = submission(wid, team, gpus, "production-inference")
    return ReplicaChange(ReplicaAction.ADOPT, wid, sub, node, app=f"{team}--app")


def canonical(d: Driver) -> str:
    return json.dumps(encode_state(d.state), sort_keys=True)


def test_replicas_queued_adopted_and_gone_are_journaled_and_counted() -> None:
    d = driver({"a": 8, "b": 8}, node_count=1)
    refused, effects = inputs.apply(d, inputs.serve_replicas([replica("serve:q"), adopt("serve:p", "n0", gpus=2)], 1.0))
    assert refused == {}
    assert journal(effects) == ["replica_pending", "adopted"]
    # An adopted replica may have no `replica_pending` before it: its event says its GPUs (the
    # console rebuilds the GPU split from the log; it showed 1 GPU of Serve where 2 were leased).
    [adopted] = [e for e in effects if getattr(e, "kind", None) == "adopted"]
    assert adopted.details["gpus"] == 2
    assert d.state.core.is_queued("serve:q") and d.lease("serve:p") is not None
    assert d.tally.team_gpus()["a"] == TeamGpus(8, 2, 0)  # followed, no rebuild
    gone = [
        ReplicaChange(ReplicaAction.RELEASE, "serve:p", reason="replica gone"),
        ReplicaChange(ReplicaAction.CANCEL, "serve:q", reason="replica gone"),
    ]
    _, effects = inputs.apply(d, inputs.serve_replicas(gone, 2.0))
    assert journal(effects) == ["released", "cancelled"]
    assert "serve:p" not in d.state.submissions and not d.state.core.is_queued("serve:q")
    assert d.tally.team_gpus()["a"] == TeamGpus(8, 0, 0)
    assert d.state.core.pool.free("n0") == 8


def test_an_adoption_the_ledger_refuses_is_reported_and_a_queued_replica_withdrawn() -> None:
    d = driver({"a": 8, "b": 8}, node_count=1)
    d.submit(submission("t", "b", 8), 0.0)
    d.tick(0.0)  # training holds the whole node
    inputs.apply(d, inputs.serve_replicas([replica("serve:q")], 1.0))
    refused, effects = inputs.apply(d, inputs.serve_replicas([adopt("serve:q", "n0")], 2.0))
    assert list(refused) == ["serve:q"] and "free in the ledger" in refused["serve:q"]
    assert journal(effects) == ["cancelled"]  # it runs already: a grant now would book GPUs nobody uses
    assert not d.state.core.is_queued("serve:q") and "serve:q" not in d.state.submissions


def test_a_change_that_no_longer_fits_does_nothing() -> None:
    d = driver({"a": 8}, node_count=1)
    inputs.apply(d, inputs.serve_replicas([replica("serve:q")], 1.0))
    d.tick(1.0)  # granted before the pool's cancel arrives
    assert d.lease("serve:q") is not None
    _, effects = inputs.apply(d, inputs.serve_replicas([ReplicaChange(ReplicaAction.CANCEL, "serve:q")], 2.0))
    assert journal(effects) == [] and any(isinstance(e, Diagnostic) for e in effects)
    assert d.lease("serve:q") is not None
    _, effects = inputs.apply(d, inputs.serve_replicas([replica("serve:q")], 2.0))  # queued twice
    assert journal(effects) == [] and d.lease("serve:q") is not None


def test_the_log_replays_the_pool_without_a_snapshot(tmp_path: Path) -> None:
    """Before, the pool changed the core outside the events and only a snapshot kept it: a
    replay of the log alone lost every replica. Now the records rebuild the same state."""
    live = driver({"a": 8, "b": 8}, node_count=2)
    wal = WriteAheadLog(tmp_path, 0)
    records = [
        inputs.submit(submission("t", "b", 8, "exploratory"), 0.0, "r0"),
        inputs.tick(0.0),
        inputs.serve_replicas([replica("serve:q", gpus=2), adopt("serve:p", "n1")], 1.0),
        inputs.tick(1.0),
        inputs.serve_replicas([adopt("serve:x", "n0", gpus=8)], 2.0),  # refused: training holds n0
        inputs.serve_replicas([ReplicaChange(ReplicaAction.RELEASE, "serve:p", reason="gone")], 3.0),
        inputs.tick(3.0),
    ]
    for record in records:
        inputs.apply(live, record)
        wal.wait_durable(wal.append(record))
    wal.close()
    assert live.lease("serve:q") is not None and "serve:p" not in live.state.submissions
    replayed = driver({"a": 8, "b": 8}, node_count=2)
    for record in read_records(tmp_path, 0):
        inputs.apply(replayed, record)
    assert canonical(replayed) == canonical(live)
    assert replayed.tally.team_gpus() == live.tally.team_gpus()
