"""What a caller of the live scheduler may send, against the promise that its state and its
write-ahead log agree: every call is either refused by name and changes nothing (neither the
state nor the log), or it is applied and logged, and replaying the log rebuilds the state.

The actor's calls take plain values from any Ray client, and a submission built with
`model_construct` or `model_copy(update=...)` skips pydantic's checks on the caller's side.
The generated test draws streams of calls in which some arguments are of another type or
sign, non-finite, or unknown, and the wall clock may step back (an NTP correction). Found by
it (stop 47), on the code before:
- a submission whose `checkpoint_interval_s` was infinite was queued, and then the log could
  not hold it (JSON has no infinity): the caller got an error, the workload ran anyway, and a
  restart from the log lost it;
- `release(lease, finished="no")` took the string as true and ended a workload that was to be
  requeued; other values of the wrong type escaped as a TypeError or an AttributeError from
  inside the driver rather than a refusal naming the field.

Pure (no Ray): `make test` runs `examples(60)` streams; `SWITCHYARD_EXAMPLES_SCALE` runs more.
"""

from __future__ import annotations

import json
import math
import tempfile
from pathlib import Path
from typing import Any

import pytest
from driver_support import driver, submission
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.cluster.scheduler_wal import WriteAheadLog, read_records
from switchyard.scheduler.api import ReleaseOutcome, WorkloadSubmission
from switchyard.scheduler.core.state_codec import encode_state
from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.inputs import InputRecordError
from switchyard.scheduler.driver.snapshot import from_document, to_document
from tests.examples import examples

GUARANTEES = {"a": 16, "b": 16}
ODD: tuple[Any, ...] = (None, 0, -1, 1.5, math.nan, math.inf, "", "ghost", True, [], {}, b"\xff")
REFUSALS = (ValueError, LookupError)  # what the actor may answer a bad call with (by name)


def _new_driver() -> Driver:
    return driver(GUARANTEES, node_count=4)


def _state(d: Driver) -> str:
    return json.dumps(encode_state(d.state), sort_keys=True)


def _submission_record(data: st.DataObject, now: float, odd: bool) -> inputs.Record:
    sub = submission(
        data.draw(st.sampled_from(["w0", "w1", "w2", "w3"])),
        data.draw(st.sampled_from("ab")),
        data.draw(st.sampled_from([1, 4, 8, 16])),
        data.draw(st.sampled_from(["training", "exploratory", "production-inference"])),
    )
    if odd:  # as a client's model_copy(update=...) sends it: pydantic checked nothing
        field = data.draw(st.sampled_from(sorted(WorkloadSubmission.model_fields)), label="odd field")
        sub = WorkloadSubmission.model_construct(**{**dict(sub), field: data.draw(st.sampled_from(ODD))})
    return inputs.submit(sub, now, data.draw(st.sampled_from([None, "r1", "r2"])))


def _call(data: st.DataObject, now: float) -> inputs.Record:
    """One call a client makes, as the actor records it; with some chance one argument odd."""

    def arg(good: Any) -> Any:
        return data.draw(st.sampled_from(ODD), label="odd value") if data.draw(st.integers(0, 9)) == 0 else good

    kind = data.draw(
        st.sampled_from(
            [
                "submit",
                "submit",
                "tick",
                "release",
                "cancel",
                "claim",
                "checkpoint",
                "resume",
                "cordon",
                "uncordon",
                "drain",
            ]
        )
    )
    workload = arg(data.draw(st.sampled_from(["w0", "w1", "w2", "w3", "ghost"])))
    lease = arg(data.draw(st.sampled_from(["w0#1", "w1#1", "w2#1", "w0#2", "ghost#1"])))
    node = arg(data.draw(st.sampled_from(["n0", "n1", "n", "ghost"])))
    if kind == "submit":
        return _submission_record(data, now, data.draw(st.integers(0, 4)) == 0)
    if kind == "release":
        return inputs.release(lease, arg(data.draw(st.booleans())), now)
    if kind == "cancel":
        return inputs.cancel(workload, now, arg(None))
    if kind == "claim":
        return inputs.claim(
            workload,
            arg(data.draw(st.sampled_from(["job-1", "job-2"]))),
            arg(data.draw(st.sampled_from([None, None, "w0#1", "w1#1", "w0#2"]))),
        )
    if kind == "checkpoint":
        return inputs.checkpoint_reported(workload, now, arg(None))
    if kind == "resume":
        return inputs.resume_reported(workload, arg(data.draw(st.integers(0, 50))), arg("ckpt"), now, None)
    if kind in ("cordon", "uncordon"):
        return getattr(inputs, kind)(node, now, arg(None))
    if kind == "drain":
        return inputs.drain(node, arg(data.draw(st.booleans())), now, None)
    return inputs.tick(now)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_every_call_is_refused_by_name_changing_nothing_or_applied_and_logged(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        d, wal, now, calls = _new_driver(), WriteAheadLog(directory, 0), 0.0, []
        try:
            for _ in range(data.draw(st.integers(5, 40), label="calls")):
                now += data.draw(st.sampled_from([0.0, 1.0, 30.0, 600.0, -3600.0]), label="clock step")
                before, logged = _state(d), wal.last_seq
                try:
                    record = _call(data, now)
                    calls.append(record)
                    inputs.apply_logged(d, wal, record)
                except REFUSALS:
                    assert _state(d) == before, f"a refused call changed the state: {calls[-1:]}"
                    assert wal.last_seq == logged, f"a refused call was logged: {calls[-1:]}"
        finally:
            wal.close()
        replayed = _new_driver()
        for record in read_records(directory, 0):
            inputs.apply(replayed, record)
        assert _state(replayed) == _state(d), f"replaying the log gave another state than the calls: {calls}"


def test_a_submission_the_log_cannot_hold_is_refused_before_it_is_queued(tmp_path: Path) -> None:
    d, wal = _new_driver(), WriteAheadLog(tmp_path, 0)
    forever = submission("w", "a").model_copy(update={"checkpoint_interval_s": math.inf})
    with pytest.raises(ValueError, match="checkpoint_interval_s must be a finite number"):
        inputs.submit(forever, 1.0, None)
    # The record as the code before built it: the driver takes it, the log cannot hold it.
    # Sealed first, it is refused before it changes anything.
    record = {"event": "submit", "now": 1.0, "request_id": None, "submission": forever.model_dump(mode="json")}
    with pytest.raises(ValueError, match="cannot hold"):
        inputs.apply_logged(d, wal, record)
    assert "w" not in d.state.submissions and wal.last_seq == 0


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("runtime_env", {"env_vars": {"A": math.nan}}, "only JSON"),  # was logged as null: replay launched another env
        ("runtime_env", {"env_vars": {"A": b"\xff"}}, "only JSON"),  # was a UnicodeDecodeError from model_dump
        ("workload_id", "w\nINFO forged log line", "workload_id"),
        ("workload_id", "", "workload_id"),
        ("workload_id", "w" * 257, "workload_id"),
        ("description", "x" * 5000, "description"),
    ],
)
def test_a_submission_field_the_platform_cannot_carry_is_refused_by_name(field: str, value: Any, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        inputs.submit(WorkloadSubmission(team="a", bundles=(8,), **{field: value}), 1.0, None)


def test_a_log_written_before_these_checks_still_replays(tmp_path: Path) -> None:
    """The checks are on new submissions only: a record or snapshot the code before wrote,
    with an id, a description or an interval they now refuse, is read back as it was (the
    scheduler would not start otherwise)."""
    d = _new_driver()
    odd = submission("w" * 300 + "\n", "a").model_copy(
        update={"description": "x" * 5000, "checkpoint_interval_s": math.inf}
    )
    record = {"event": "submit", "now": 1.0, "request_id": None, "submission": odd.model_dump(mode="json")}
    inputs.apply(d, record)
    inputs.apply(d, inputs.tick(2.0))
    assert d.lease(odd.workload_id) is not None
    document = to_document(d.state, 2, 2.0)
    restored = from_document(json.loads(json.dumps(document)), "snapshot")
    assert restored.state.submissions[odd.workload_id] == odd


def test_a_flag_of_another_type_is_refused_not_read_as_true(tmp_path: Path) -> None:
    """`finished="no"` ended the workload (a non-empty string is true) instead of requeuing it."""
    d, wal = _new_driver(), WriteAheadLog(tmp_path, 0)
    inputs.apply_logged(d, wal, inputs.submit(submission("w", "a"), 1.0, None))
    inputs.apply_logged(d, wal, inputs.tick(2.0))
    grant = d.lease("w")
    assert grant is not None
    inputs.apply_logged(d, wal, inputs.drain(grant.placements[0].node_id, False, 3.0, None))
    assert d.notice("w") is not None  # preempted: an unfinished release requeues it
    with pytest.raises(InputRecordError, match="'release': finished must be true or false, not str 'no'"):
        inputs.apply_logged(d, wal, inputs.release(grant.lease_id, "no", 4.0))  # type: ignore[arg-type]
    assert d.lease("w") == grant
    assert inputs.apply_logged(d, wal, inputs.release(grant.lease_id, False, 4.0))[0] is ReleaseOutcome.REQUEUED


@pytest.mark.parametrize(
    "record",
    [
        inputs.cancel(["w"], 1.0, None),  # type: ignore[arg-type]
        inputs.cordon(-1, 1.0, None),  # type: ignore[arg-type]
        inputs.resume_reported("w", math.nan, "ckpt", 1.0, None),  # type: ignore[arg-type]
        inputs.checkpoint_reported("w", 1.0, 7),  # type: ignore[arg-type]
        inputs.tick(math.nan),
    ],
    ids=["cancel-list", "cordon-int", "resume-nan-step", "checkpoint-int-request-id", "tick-nan"],
)
def test_an_argument_of_another_type_is_refused_naming_it(record: inputs.Record) -> None:
    d = _new_driver()
    before = _state(d)
    with pytest.raises(InputRecordError, match=f"'{record['event']}': "):
        inputs.apply(d, record)
    assert _state(d) == before
