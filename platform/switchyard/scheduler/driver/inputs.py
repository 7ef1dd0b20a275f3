"""The driver's input events as plain records: what the write-ahead log holds.

One record per event the driver took (a submission, a claim, a release, the node set, a tick
of the clock, ...), with the `now` it was given: JSON-ready dicts. `apply` is the one way an
event reaches the driver, live and on replay alike, so the two cannot take different paths:
replaying the records after a snapshot through `apply` rebuilds the state the live actor had
(the driver is deterministic; `tests/scheduler/test_wal_replay.py` checks it across hash seeds).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, Protocol, TypeVar

from switchyard.scheduler.api import LeaseGrant, ReleaseOutcome, WorkloadSubmission
from switchyard.scheduler.core import Decisions, Node
from switchyard.scheduler.driver.driver import Driver
from switchyard.scheduler.driver.effects import Effect
from switchyard.scheduler.driver.node_cordons import DrainReport
from switchyard.scheduler.driver.serve_replicas import ReplicaChange

Record = dict[str, Any]
Answer = str | LeaseGrant | ReleaseOutcome | DrainReport | dict[str, str] | None
Line = TypeVar("Line")


class EventLog(Protocol[Line]):
    """The write-ahead log as the live path uses it (`cluster.scheduler_wal.WriteAheadLog`)."""

    def seal(self, record: Record) -> Line: ...

    def write(self, line: Line) -> int: ...


class InputRecordError(ValueError):
    """A record that names no event the driver knows, or lacks one of its fields."""


def submit(submission: WorkloadSubmission, now: float, request_id: str | None) -> Record:
    """The record of a new submission. Raises ValueError for one the platform cannot carry
    (`WorkloadSubmission.check_new`), or whose values do not fit its fields (built with
    `model_construct` or `model_copy(update=...)`, which pydantic does not check)."""
    submission.check_new()
    document = submission.model_dump(mode="json", warnings="error")
    return {"event": "submit", "now": now, "request_id": request_id, "submission": document}


def cancel(workload_id: str, now: float, request_id: str | None) -> Record:
    return {"event": "cancel", "now": now, "request_id": request_id, "workload_id": workload_id}


def claim(workload_id: str, ray_job_id: str, lease_id: str | None = None) -> Record:
    return {"event": "claim", "workload_id": workload_id, "ray_job_id": ray_job_id, "lease_id": lease_id}


def release(lease_id: str, finished: bool, now: float) -> Record:
    return {"event": "release", "now": now, "lease_id": lease_id, "finished": finished}


def checkpoint_reported(workload_id: str, now: float, request_id: str | None = None) -> Record:
    return {"event": "checkpoint_reported", "now": now, "workload_id": workload_id, "request_id": request_id}


def resume_reported(workload_id: str, step: int, checkpoint: str, now: float, request_id: str | None) -> Record:
    return {
        "event": "resume_reported",
        "now": now,
        "workload_id": workload_id,
        "step": step,
        "checkpoint": checkpoint,
        "request_id": request_id,
    }


def cordon(node: str, now: float, request_id: str | None) -> Record:
    return {"event": "cordon", "now": now, "node": node, "request_id": request_id}


def uncordon(node: str, now: float, request_id: str | None) -> Record:
    return {"event": "uncordon", "now": now, "node": node, "request_id": request_id}


def drain(node: str, force: bool, now: float, request_id: str | None) -> Record:
    return {"event": "drain", "now": now, "node": node, "force": force, "request_id": request_id}


def nodes_seen(nodes: Iterable[Node], now: float) -> Record:
    return {"event": "nodes_seen", "now": now, "nodes": [dataclasses.asdict(n) for n in nodes]}


def job_launched(workload_id: str, submission_id: str) -> Record:
    return {"event": "job_launched", "workload_id": workload_id, "submission_id": submission_id}


def launch_failed(workload_id: str, lease_id: str, error: str, now: float) -> Record:
    return {"event": "launch_failed", "now": now, "workload_id": workload_id, "lease_id": lease_id, "error": error}


def grant_displaced(workload_id: str, lease_id: str, error: str, now: float) -> Record:
    return {"event": "grant_displaced", "now": now, "workload_id": workload_id, "lease_id": lease_id, "error": error}


def job_exited(workload_id: str, submission_id: str, status: str, now: float) -> Record:
    return {
        "event": "job_exited",
        "now": now,
        "workload_id": workload_id,
        "submission_id": submission_id,
        "status": status,
    }


def serve_replicas(changes: Iterable[ReplicaChange], now: float) -> Record:
    return {"event": "serve_replicas", "now": now, "changes": [c.to_record() for c in changes]}


def tick(now: float) -> Record:
    return {"event": "tick", "now": now}


def apply(
    driver: Driver, record: Record, on_decisions: Callable[[Decisions], None] | None = None
) -> tuple[Answer, list[Effect]]:
    """Give the driver the event `record` holds; returns the caller's answer and the effects.
    Raises what the driver raises for a bad request (nothing has changed then)."""
    try:
        answer, effects = _dispatch(driver, record, on_decisions)
    except KeyError as exc:
        if exc.args and exc.args[0] in record.keys() | _FIELDS:
            raise InputRecordError(f"{record.get('event')!r} record lacks field {exc.args[0]!r}") from None
        raise
    if record["event"] != "tick":
        driver.changed()  # live and on replay alike: a restored driver passes first anyway
    return answer, effects


_FIELDS = {
    "event",
    "now",
    "request_id",
    "submission",
    "workload_id",
    "ray_job_id",
    "lease_id",
    "finished",
    "nodes",
    "node",
    "force",
    "step",
    "checkpoint",
    "submission_id",
    "error",
    "status",
    "changes",
    "action",
}


def _dispatch(
    driver: Driver, r: Record, on_decisions: Callable[[Decisions], None] | None
) -> tuple[Answer, list[Effect]]:
    event = r["event"]
    # The fields a caller of the live scheduler gives are read by type (`Fields`): a Ray client
    # may call the actor with any value, and a string where a flag belongs must not be truthy.
    f = Fields(r)
    if event == "submit":
        sub = WorkloadSubmission.model_validate(r["submission"])
        return sub.workload_id, driver.submit(sub, f.now(), f.optional_text("request_id"))
    if event == "cancel":
        return None, driver.cancel(f.text("workload_id"), f.now(), f.optional_text("request_id"))
    if event == "claim":
        lease = f.optional_text("lease_id", required=False)  # records from before it have none
        return driver.claim(f.text("workload_id"), f.text("ray_job_id"), lease)
    if event == "release":
        return driver.release(f.text("lease_id"), f.flag("finished"), f.now())
    if event == "checkpoint_reported":  # records from before request ids have none
        return None, driver.checkpoint_reported(
            f.text("workload_id"), f.now(), f.optional_text("request_id", required=False)
        )
    if event == "resume_reported":
        step, checkpoint = f.count("step"), f.text("checkpoint")
        return None, driver.resume_reported(
            f.text("workload_id"), step, checkpoint, f.now(), f.optional_text("request_id")
        )
    if event == "cordon":
        return driver.cordon(f.text("node"), f.now(), f.optional_text("request_id"))
    if event == "uncordon":
        return driver.uncordon(f.text("node"), f.now(), f.optional_text("request_id"))
    if event == "drain":
        return driver.drain(f.text("node"), f.flag("force"), f.now(), f.optional_text("request_id"))
    # The rest come from the actor's own watchers (Ray's node set, its job and Serve state).
    if event == "nodes_seen":
        return None, driver.nodes_seen([Node(**n) for n in r["nodes"]], r["now"])
    if event == "job_launched":
        return None, driver.job_launched(r["workload_id"], r["submission_id"])
    if event == "launch_failed":
        return None, driver.launch_failed(r["workload_id"], r["lease_id"], r["error"], r["now"])
    if event == "grant_displaced":
        return None, driver.grant_displaced(r["workload_id"], r["lease_id"], r["error"], r["now"])
    if event == "job_exited":
        return None, driver.job_exited(r["workload_id"], r["submission_id"], r["status"], r["now"])
    if event == "serve_replicas":
        return driver.serve_replicas([ReplicaChange.from_record(c) for c in r["changes"]], r["now"])
    if event == "tick":
        return None, driver.tick(f.now(), on_decisions)
    raise InputRecordError(f"unknown event {event!r} in record {r}")


class Fields:
    """A record's fields read by type; InputRecordError names the event and the field."""

    def __init__(self, record: Record) -> None:
        self._r = record

    def _refuse(self, key: str, expected: str) -> NoReturn:
        value = self._r[key]
        raise InputRecordError(
            f"{self._r['event']!r}: {key} must be {expected}, not {type(value).__name__} {value!r:.60}"
        )

    def text(self, key: str) -> str:
        value = self._r[key]
        if not isinstance(value, str):
            self._refuse(key, "a string")
        return value

    def optional_text(self, key: str, required: bool = True) -> str | None:
        """A string or null; `required=False`: a record without the field (written before it
        existed) reads as null."""
        if not required and key not in self._r:
            return None
        value = self._r[key]
        if value is not None and not isinstance(value, str):
            self._refuse(key, "a string or null")
        return value

    def flag(self, key: str) -> bool:
        value = self._r[key]
        if not isinstance(value, bool):
            self._refuse(key, "true or false")
        return value

    def count(self, key: str) -> int:
        value = self._r[key]
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            self._refuse(key, "a whole number of at least 0")
        return value

    def now(self) -> float:
        value = self._r["now"]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            self._refuse("now", "a finite time")
        return value  # as given: replay must rebuild the very values the live state took


def apply_logged(
    driver: Driver, log: EventLog[Line], record: Record, on_decisions: Callable[[Decisions], None] | None = None
) -> tuple[Answer, list[Effect], int]:
    """The live path: `record` sealed as the log's next line, applied, then written; returns the
    answer, the effects and the record's seq. Sealed first, so an event the log cannot hold (a
    non-finite number) is refused before it changes anything, as is one the driver refuses: the
    log then holds exactly the events the state took, and replay rebuilds it. The caller holds
    its lock throughout."""
    line = log.seal(record)
    answer, effects = apply(driver, record, on_decisions)
    return answer, effects, log.write(line)


def nodes_unchanged(driver: Driver, nodes: Iterable[Node]) -> bool:
    """True when Ray reports exactly the nodes the driver has (no record needed)."""
    return {n.name: n for n in nodes} == driver.state.nodes
