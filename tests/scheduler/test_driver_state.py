"""The driver's state survives the journal: old journals load, and a restored driver carries on."""

from __future__ import annotations

import json
import pickle
from dataclasses import dataclass

import pytest
from driver_support import admit, driver, submission

from switchyard.scheduler.api import ReleaseOutcome
from switchyard.scheduler.driver import Driver, LaunchedJob, LiveState
from switchyard.scheduler.driver.snapshot import from_document, to_document


@dataclass(frozen=True)
class AdapterLaunchedJob:
    """The shape of `switchyard.cluster.job_launcher.LaunchedJob`, which old journals hold."""

    workload_id: str
    submission_id: str


def a_state() -> LiveState:
    d = driver({"a": 8, "b": 8}, node_count=2)
    d.submit(submission("run", "a", 8, entrypoint="go"), 0)
    d.tick(0)
    d.job_launched("run", "run-1")
    d.submit(submission("wait", "b", 16), 1)
    return d.state


def test_a_journal_from_before_a_field_existed_restores_it_empty() -> None:
    old = a_state()
    del old.__dict__["released"], old.__dict__["claim_timeouts"]
    old.launched = {"run": AdapterLaunchedJob("run", "run-1")}  # type: ignore[dict-item]
    restored = pickle.loads(pickle.dumps(old))
    assert restored.released == {} and restored.claim_timeouts == {}
    assert restored.launched == {"run": LaunchedJob("run", "run-1")}
    assert restored.grants["run"].lease_id == old.grants["run"].lease_id


def test_a_journal_naming_the_actor_modules_classes_loads() -> None:
    """Journals written before the driver existed name `LiveState` in the Ray actor's module, and
    launched jobs in the job launcher's; the actor module keeps the alias."""
    pytest.importorskip("ray")  # the alias lives in the Ray adapter: importing it starts nothing
    blob = pickle.dumps(a_state(), protocol=2)  # protocol 2 names classes as "module\nname"
    for new, old in (
        (b"switchyard.scheduler.driver.state\nLiveState\n", b"switchyard.cluster.scheduler_actor\nLiveState\n"),
        (b"switchyard.scheduler.driver.state\nLaunchedJob\n", b"switchyard.cluster.job_launcher\nLaunchedJob\n"),
    ):
        assert new in blob
        blob = blob.replace(new, old)
    restored = pickle.loads(blob)
    assert isinstance(restored, LiveState)
    assert restored.launched == {"run": LaunchedJob("run", "run-1")}


def test_a_driver_restored_from_a_snapshot_carries_on() -> None:
    d = driver({"a": 0, "b": 8})
    grant = admit(d, submission("a0", "a", 8), 0)
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    assert d.release(grant.lease_id, False, 60)[0] is ReleaseOutcome.REQUEUED
    doc = json.loads(json.dumps(to_document(d.state, 7, 60.0)))
    again = Driver(from_document(doc, "test").state)
    # A call Ray replays after the restart gets the answer given before it.
    assert again.release(grant.lease_id, False, 61) == (ReleaseOutcome.REQUEUED, [])
    again.tick(62)
    assert again.lease("b0") is not None and again.lease("a0") is None
    assert [p.request.workload_id for p in again.state.core.pending()] == ["a0"]
