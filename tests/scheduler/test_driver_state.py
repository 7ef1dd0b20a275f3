"""The driver's state survives the journal: old journals and snapshots load, and a restored
driver carries on."""

from __future__ import annotations

import json
import pickle
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from driver_support import GRACE_S, admit, as_version_3, as_version_5, driver, submission
from pydantic import BaseModel

from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.scheduler import api
from switchyard.scheduler.api import ReleaseOutcome
from switchyard.scheduler.driver import Driver, LaunchedJob, LiveState
from switchyard.scheduler.driver.snapshot import SCHEMA_VERSION, SnapshotVersionError, from_document, to_document
from switchyard.scheduler.preemption_channel import PreemptionNotice


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


class Notice(BaseModel):
    """`switchyard.scheduler.api.Notice` as it was before there was one preemption-notice type:
    what old snapshots and pickled journals hold."""

    workload_id: str
    lease_id: str
    reason: str
    stop_deadline: float


def a_noticed_driver() -> tuple[Driver, str]:
    """A driver whose workload a0 is under a preemption notice (sent at 50); its lease id."""
    d = driver({"a": 0, "b": 8})
    grant = admit(d, submission("a0", "a", 8), 0)  # borrows all of b's guarantee
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)
    assert d.notice("a0") == PreemptionNotice("a0", "reclaim for b0", 50 + GRACE_S, sent_at=50, lease_id=grant.lease_id)
    return d, grant.lease_id


def as_version_2(node: Any) -> Any:
    """An encoded state as schema version 2 wrote it: as version 3 (above), and a notice was
    the api's `Notice` model, written as its `model_dump(mode="json")` (and took no object id)."""
    return _notices_as_version_2(as_version_3(node))


def _notices_as_version_2(node: Any) -> Any:
    if isinstance(node, list):
        return [_notices_as_version_2(v) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("c") == "switchyard.scheduler.preemption_channel:PreemptionNotice":
        v = node["v"]
        old = Notice(workload_id=v["job_id"], lease_id=v["lease_id"], reason=v["reason"], stop_deadline=v["deadline"])
        return {"t": "model", "c": "switchyard.scheduler.api:Notice", "v": old.model_dump(mode="json")}
    return {k: _notices_as_version_2(v) for k, v in node.items()}


def test_a_version_2_snapshot_loads_its_notices_as_preemption_notices() -> None:
    d, lease_id = a_noticed_driver()
    current = json.loads(json.dumps(to_document(d.state, 7, 60.0)))
    assert current["schema_version"] == SCHEMA_VERSION == 6
    old = {**as_version_2(current), "schema_version": 2}
    assert "switchyard.scheduler.api:Notice" in json.dumps(old) and "PreemptionNotice" not in json.dumps(old)
    snap = from_document(old, "old.json")
    assert snap.state.notices == d.state.notices  # sent at its lease's notice_at
    # The same state as this version's snapshot of it, object ids and all.
    assert json.loads(json.dumps(to_document(snap.state, 7, 60.0))) == current
    restored = Driver(snap.state)
    assert restored.release(lease_id, False, 61)[0] is ReleaseOutcome.REQUEUED
    assert restored.notice("a0") is None


def test_a_version_2_notice_without_its_lease_is_sent_by_the_snapshot_time() -> None:
    d, lease_id = a_noticed_driver()
    old = {**as_version_2(json.loads(json.dumps(to_document(d.state, 7, 60.0)))), "schema_version": 2}
    text = json.dumps(old).replace(f'"lease_id": "{lease_id}", "reason"', '"lease_id": "gone", "reason"')
    notice = from_document(json.loads(text), "old.json").state.notices["a0"]
    assert (notice.lease_id, notice.sent_at) == ("gone", 60.0)


def test_a_version_2_snapshot_that_does_not_migrate_is_refused_by_name() -> None:
    d, _ = a_noticed_driver()
    old = {**as_version_2(json.loads(json.dumps(to_document(d.state, 7, 60.0)))), "schema_version": 2}
    text = json.dumps(old).replace('"stop_deadline"', '"deadline_s"')
    with pytest.raises(SnapshotVersionError, match=r"old.json: snapshot schema version 2 does not migrate to 3"):
        from_document(json.loads(text), "old.json")


def a_driver_with_holds() -> Driver:
    """A driver whose core holds a blocked gang's reservation and a cordoned node."""
    d = driver({"a": 8, "b": 8}, node_count=3)
    d.cordon("n2", 0)
    admit(d, submission("a0", "a", 8), 0)
    two_nodes = submission("b-big", "b", 8).model_copy(update={"bundles": (8, 8)})
    d.submit(two_nodes, 1)  # blocked behind a0: reserves
    d.tick(1)
    assert d.state.core.reservations() and d.state.core._holds.per_node
    return d


def test_a_version_3_snapshot_loads_the_cores_holds_as_one_object() -> None:
    d = a_driver_with_holds()
    current = json.loads(json.dumps(to_document(d.state, 7, 60.0)))
    old = {**as_version_3(current), "schema_version": 3}
    assert '"_reserved"' in json.dumps(old) and "core.holds:Holds" not in json.dumps(old)
    snap = from_document(old, "old.json")
    core = snap.state.core
    assert core.reservations() == d.state.core.reservations()
    assert core._holds.per_node == d.state.core._holds.per_node  # the cordon's hold included
    assert core._holds.open_gpus() == d.state.core._holds.open_gpus()
    assert core._holds._pool is core.pool  # one node pool, as the core wrote it
    # The same state as this version's snapshot of it, object ids and all.
    assert json.loads(json.dumps(to_document(snap.state, 7, 60.0))) == current
    restored = Driver(snap.state)
    restored.release(d.state.core.lease_of("a0").lease_id, True, 61)  # type: ignore[union-attr]
    restored.tick(62)
    assert restored.lease("b-big") is not None  # its reservation came back and it starts


def test_a_version_3_snapshot_that_does_not_migrate_is_refused_by_name() -> None:
    d = a_driver_with_holds()
    old = {**as_version_3(json.loads(json.dumps(to_document(d.state, 7, 60.0)))), "schema_version": 3}
    text = json.dumps(old).replace('"_hold_counts"', '"_counts"')
    with pytest.raises(SnapshotVersionError, match=r"old.json: snapshot schema version 3 does not migrate to 4"):
        from_document(json.loads(text), "old.json")


def test_a_version_5_snapshot_counts_the_inference_gpus_a_reservation_avoids() -> None:
    """Version 6 counts the GPUs of running non-preemptible leases per node, which a blocked
    gang's reservation treats as held; a version 5 snapshot gets the count from its leases.
    n0: an inference replica (7 GPUs free); n1: a 2-GPU lease (6 free). A blocked 8-GPU gang
    then reserves n1, where it can start, and not n0, the node closest to fitting it."""
    d = driver({"inf": 8, "a": 8}, node_count=2)
    admit(d, submission("inf-0", "inf", 1, "production-inference"), 0)
    fill = admit(d, submission("a-fill", "a", 7), 0)
    admit(d, submission("a-two", "a", 2), 0)
    placed = {w: {p.node_id for p in d.lease(w).placements} for w in ("inf-0", "a-fill", "a-two")}  # type: ignore[union-attr]
    assert placed == {"inf-0": {"n0"}, "a-fill": {"n0"}, "a-two": {"n1"}}
    d.release(fill.lease_id, True, 1)
    current = json.loads(json.dumps(to_document(d.state, 7, 2.0)))
    old = {**as_version_5(current), "schema_version": 5}
    assert '"_unpreemptible"' not in json.dumps(old)
    snap = from_document(old, "old.json")
    assert snap.state.core._unpreemptible == d.state.core._unpreemptible == {"n0": 1}
    assert json.loads(json.dumps(to_document(snap.state, 7, 2.0))) == current
    restored = Driver(snap.state)
    restored.submit(submission("a-big", "a", 8, "exploratory"), 3)
    restored.tick(3)
    assert restored.state.core.reservations() == {"a-big": {"n1": 8}}


def test_a_pickled_journal_with_a_notice_loads_it_as_a_preemption_notice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Journals from before the write-ahead log pickled the state, its notices as `api.Notice`s."""
    d, lease_id = a_noticed_driver()
    state, sent = d.state, d.state.notices["a0"]
    assert sent.deadline is not None
    state.notices = {"a0": Notice(workload_id="a0", lease_id=lease_id, reason=sent.reason, stop_deadline=sent.deadline)}  # type: ignore[dict-item]
    monkeypatch.setattr(Notice, "__module__", "switchyard.scheduler.api")
    monkeypatch.setattr(api, "Notice", Notice, raising=False)
    blob = pickle.dumps(state)  # names the class as the old code did
    monkeypatch.undo()
    assert not hasattr(api, "Notice")
    db = sqlite3.connect(tmp_path / "scheduler.db")
    db.execute("CREATE TABLE snapshot (id INTEGER PRIMARY KEY, state BLOB NOT NULL)")
    db.execute("INSERT INTO snapshot (id, state) VALUES (1, ?)", (blob,))
    db.commit()
    db.close()
    journal = SchedulerJournal(tmp_path / "scheduler.db")
    try:
        restored = journal.legacy_state()
    finally:
        journal.close()
    assert isinstance(restored, LiveState) and restored.notices == {"a0": sent}
    assert Driver(restored).notice("a0") == sent
