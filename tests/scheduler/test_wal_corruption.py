"""The scheduler's write-ahead log and snapshots against generated damage.

A driver runs a drawn stream of submits, ticks, releases and cancels, logging every event
(and snapshotting at a drawn point). Then one thing happens to the files: a byte changed
anywhere in a segment or the snapshot, a line deleted, doubled, swapped with the next or
preceded by junk, or the last line cut short. Recovery then either stops with an error that
names the file (`WalCorruptError`, `ReplayDivergedError`, `SnapshotVersionError`), or rebuilds
exactly the state the driver had. The one allowed loss is the last record when the damage is
in the last line: that is what a crash mid-append leaves, and it was never acknowledged (a
last line deleted whole is the same loss, and nothing in the files can tell it apart).
Found by this test (stop 43): a changed digit (a GPU count, a time) still parsed, and replay
silently rebuilt another state; each line and snapshot now carries a CRC-32.

Pure (no Ray): `make test` runs `examples(80)` streams; `SWITCHYARD_EXAMPLES_SCALE` runs more.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from driver_support import driver, submission
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_recovery import ReplayDivergedError, recover, snapshot_document, write_snapshot
from switchyard.cluster.scheduler_wal import SnapshotFiles, WalCorruptError, WriteAheadLog
from switchyard.scheduler.core.state_codec import encode_state
from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.snapshot import SnapshotVersionError
from tests.examples import examples

GUARANTEES = {"a": 8, "b": 8}
NAMED_ERRORS = (WalCorruptError, ReplayDivergedError, SnapshotVersionError)


def _state(d: Driver) -> str:
    return json.dumps(encode_state(d.state), sort_keys=True)


def _new_driver() -> Driver:
    return driver(GUARANTEES, node_count=3)


def _run(directory: Path, data: st.DataObject) -> tuple[list[str], int]:
    """A drawn event stream, logged; the state after each logged record (index 0: before
    any), and the seq a snapshot was taken after (0: none)."""
    d, wal = _new_driver(), WriteAheadLog(directory, 0)
    states, snapshot_at, now = [_state(d)], 0, 0.0
    events = data.draw(st.integers(3, 25), label="events")
    snap = data.draw(st.integers(0, events), label="snapshot after")  # 0: no snapshot
    for i in range(events):
        now += data.draw(st.sampled_from([0.0, 1.0, 30.0]))
        kind = data.draw(st.sampled_from(["submit", "submit", "tick", "release", "cancel"]))
        leased = [w for w in d.state.submissions if d.lease(w) is not None]
        if kind == "release" and leased:
            grant = d.lease(data.draw(st.sampled_from(sorted(leased))))
            assert grant is not None
            record = inputs.release(grant.lease_id, data.draw(st.booleans()), now)
        elif kind == "cancel" and d.state.submissions:
            record = inputs.cancel(data.draw(st.sampled_from(sorted(d.state.submissions))), now, f"c{i}")
        elif kind == "tick":
            record = inputs.tick(now)
        else:
            team, gpus = data.draw(st.sampled_from("ab")), data.draw(st.sampled_from([1, 2, 4, 8]))
            priority = data.draw(st.sampled_from(["training", "exploratory"]))
            record = inputs.submit(submission(f"w{i}", team, gpus, priority), now, f"r{i}")
        try:
            inputs.apply(d, record)
        except (ValueError, KeyError):  # refused (a repeat, a finished lease): the actor logs nothing
            continue
        wal.wait_durable(wal.append(record))
        states.append(_state(d))
        if i + 1 == snap:
            document, snapshot_at = snapshot_document(d, wal, now)
            write_snapshot(SnapshotFiles(directory), document, snapshot_at)
    wal.close()
    return states, snapshot_at


def _damage(directory: Path, data: st.DataObject) -> tuple[str, bool]:
    """Damage one file; what was done, and whether only the last line of the last segment was."""
    segments = sorted(directory.glob("wal-*.jsonl"))
    files = [p for p in segments + sorted(directory.glob("snapshot-*.json")) if p.stat().st_size]
    path = data.draw(st.sampled_from(files), label="file")
    raw = path.read_bytes()
    lines = raw.split(b"\n")[:-1]  # complete lines
    last_line_from = len(raw) - len(lines[-1]) - 1 if lines else 0
    in_last = path == segments[-1] and path.suffix == ".jsonl"
    how = data.draw(st.sampled_from(["flip", "flip", "delete", "double", "swap", "junk", "cut"]), label="damage")
    if how == "flip" or not lines or path.suffix == ".json":
        at = data.draw(st.integers(0, len(raw) - 1), label="byte")
        path.write_bytes(raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :])
        return f"{path.name}: byte {at} changed", in_last and at >= last_line_from
    n = data.draw(st.integers(0, len(lines) - 1), label="line")
    if how == "cut":
        keep = data.draw(st.integers(last_line_from, len(raw) - 1), label="cut at")
        path.write_bytes(raw[:keep])
        return f"{path.name}: cut at byte {keep} of {len(raw)}", in_last
    if how == "swap" and n + 1 < len(lines):
        lines[n], lines[n + 1] = lines[n + 1], lines[n]
    elif how == "double":
        lines.insert(n, lines[n])
    elif how == "junk":
        lines.insert(n, b'{"seq": 1, "event": "tick", "now": 0.0}')
    else:
        how = "delete"
        del lines[n]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    # A last line deleted whole reads as a log one record shorter: nothing in the files says
    # otherwise (the one loss allowed, as for a crash).
    return f"{path.name}: line {n + 1} {how}", in_last and how == "delete" and n == len(lines)


@settings(max_examples=examples(80), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_damaged_logs_stop_recovery_by_name_or_recover_the_state(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "wal"
        states, snapshot_at = _run(directory, data)
        what, last_line_only = _damage(directory, data)
        journal = SchedulerJournal(Path(tmp) / "scheduler.db")
        try:
            got = recover(directory, journal, lambda s: Driver(s) if s is not None else _new_driver())
        except NAMED_ERRORS as exc:
            assert str(directory) in str(exc), f"{what}: the error names no file: {exc}"
            return
        except Exception as exc:
            raise AssertionError(f"{what} (snapshot after {snapshot_at}): {type(exc).__name__}: {exc}") from exc
        got.wal.close()
        rebuilt = _state(got.driver)
        allowed = [states[-1]] + ([states[-2]] if last_line_only and len(states) > 1 else [])
        assert rebuilt in allowed, f"{what} (snapshot after {snapshot_at}): recovery rebuilt another state"
