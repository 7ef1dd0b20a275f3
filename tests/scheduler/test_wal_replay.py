"""The write-ahead log: replay rebuilds the live state (across hash seeds), bad lines are named,
a torn last line is dropped, and snapshots of other schema versions are refused by name."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, NoReturn

import pytest
from driver_support import driver, submission

from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_recovery import recover, snapshot_document, write_snapshot
from switchyard.cluster.scheduler_wal import SnapshotFiles, WalCorruptError, WalWriteError, WriteAheadLog, read_records
from switchyard.scheduler.core.state_codec import encode_state
from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.snapshot import SCHEMA_VERSION, SnapshotVersionError, from_document, to_document

HERE = Path(__file__).parent


def run_events(wal_dir: Path) -> Driver:
    """A driver taken through submits, ticks, a preemption and releases, every event logged."""
    d = driver({"a": 8, "b": 8}, node_count=3)
    wal = WriteAheadLog(wal_dir, 0)
    records = [inputs.submit(submission(f"w{i}", "ab"[i % 2], 8, "exploratory"), float(i), f"r{i}") for i in range(5)]
    records += [inputs.tick(10.0), inputs.submit(submission("p", "a", 8, "training"), 11.0, "rp"), inputs.tick(12.0)]
    records += [inputs.release("w0#1", False, 13.0), inputs.tick(14.0), inputs.cancel("w4", 15.0, "rc")]
    records += [inputs.claim("w1", "job-1"), inputs.tick(16.0)]
    for record in records:
        inputs.apply(d, record)
        wal.wait_durable(wal.append(record))
    wal.close()
    return d


def canonical(d: Driver) -> str:
    return json.dumps(encode_state(d.state), sort_keys=True)


def test_replay_rebuilds_the_state_under_another_hash_seed(tmp_path: Path) -> None:
    live = run_events(tmp_path)
    script = f"""
import sys; sys.path.insert(0, {str(HERE)!r})
from pathlib import Path
from driver_support import driver
from switchyard.cluster.scheduler_wal import read_records
from switchyard.scheduler.driver import inputs
from test_wal_replay import canonical
d = driver({{"a": 8, "b": 8}}, node_count=3)
for r in read_records(Path({str(tmp_path)!r}), 0):
    inputs.apply(d, r)
print(canonical(d))
"""
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == canonical(live)
    assert live.lease("p") is not None  # the preemption happened: replay covered it


def test_recovery_from_a_snapshot_and_the_records_after_it(tmp_path: Path) -> None:
    live = run_events(tmp_path)
    base = driver({"a": 8, "b": 8}, node_count=3)
    records = list(read_records(tmp_path, 0))
    for r in records[:6]:
        inputs.apply(base, r)
    (tmp_path / "snapshot-000000000006.json").write_text(json.dumps(to_document(base.state, 6, 10.0)))
    journal = SchedulerJournal(tmp_path / "scheduler.db")
    got = recover(tmp_path, journal, lambda s: Driver(s) if s is not None else driver({}, 0))
    assert (got.snapshot_seq, got.replayed) == (6, len(records) - 6)
    assert canonical(got.driver) == canonical(live)
    assert {e["kind"] for e in journal.events()} >= {"requeued", "cancelled"}  # rows after the snapshot
    got.wal.close()


def test_recovery_reports_the_latest_time_the_snapshot_or_the_log_holds(tmp_path: Path) -> None:
    """What a restarted scheduler's clock may not start behind (`scheduler_clock`): the last
    record's time (a claim, which carries none, comes before the last tick at 16), or the
    snapshot's when no later record holds a time."""
    run_events(tmp_path)
    journal = SchedulerJournal(tmp_path / "scheduler.db")
    got = recover(tmp_path, journal, lambda s: driver({"a": 8, "b": 8}, node_count=3))
    assert got.last_time == 16.0
    document, seq = snapshot_document(got.driver, got.wal, 99.0)
    write_snapshot(SnapshotFiles(tmp_path), document, seq)
    got.wal.wait_durable(got.wal.append(inputs.claim("w3", "job-3")))
    got.wal.close()
    again = recover(tmp_path, journal, lambda s: Driver(s))
    assert (again.replayed, again.last_time) == (1, 99.0)
    again.wal.close()


def test_a_torn_last_line_is_dropped_and_the_log_carries_on(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    whole = len(list(read_records(tmp_path, 0)))
    with open(segment, "ab") as f:
        f.write(b'{"seq": 99, "event": "ti')  # a crash mid-append
    assert len(list(read_records(tmp_path, 0))) == whole
    assert "cut short by a crash" in caplog.text
    assert segment.read_bytes().endswith(b"\n")  # cut from the file too


def test_a_corrupt_middle_line_stops_recovery_with_its_line_number(tmp_path: Path) -> None:
    run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    lines = segment.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    segment.write_bytes(b"\n".join(lines))
    with pytest.raises(WalCorruptError, match=rf"{segment.name}:3: not a write-ahead-log record"):
        list(read_records(tmp_path, 0))
    assert segment.read_bytes().count(b"\n") == len(lines) - 1  # nothing was cut


def test_a_gap_in_the_sequence_is_named(tmp_path: Path) -> None:
    run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    lines = segment.read_bytes().split(b"\n")
    segment.write_bytes(b"\n".join(lines[:3] + lines[4:]))
    with pytest.raises(WalCorruptError, match="records are missing"):
        list(read_records(tmp_path, 0))


def test_snapshots_of_another_schema_version_are_refused_naming_both() -> None:
    doc = json.loads(json.dumps(to_document(driver({"a": 8}).state, 0, 0.0)))
    assert from_document(doc, "s.json").wal_seq == 0
    with pytest.raises(SnapshotVersionError, match=rf"s.json: snapshot schema version 0 .* version {SCHEMA_VERSION}"):
        from_document({**doc, "schema_version": 0}, "s.json")
    with pytest.raises(SnapshotVersionError, match=rf"version {SCHEMA_VERSION + 1} is newer than this code's"):
        from_document({**doc, "schema_version": SCHEMA_VERSION + 1}, "s.json")


def test_a_retried_submit_or_cancel_is_answered_not_redone() -> None:
    d = driver({"a": 8})
    sub = submission("w", "a", 8)
    assert inputs.apply(d, inputs.submit(sub, 0.0, "r1"))[1]
    assert inputs.apply(d, inputs.submit(sub, 1.0, "r1")) == ("w", [])  # no "already submitted"
    inputs.apply(d, inputs.cancel("w", 2.0, "r2"))
    assert inputs.apply(d, inputs.cancel("w", 3.0, "r2")) == (None, [])  # no KeyError


def test_finished_workloads_are_forgotten_after_the_retention_period() -> None:
    d = Driver.empty(driver({"a": 8}).state.core.policy, 0.0, retention_s=100.0)
    d.nodes_seen(driver({"a": 8}).state.nodes.values(), 0.0)
    d.submit(submission("w", "a", 8), 0.0)
    d.tick(1.0)
    grant = d.lease("w")
    assert grant is not None
    d.release(grant.lease_id, True, 2.0)
    d.tick(50.0)
    assert "w" in d.state.submissions and d.state.core._attempts == {"w": 1}
    d.tick(103.0)
    assert "w" not in d.state.submissions and d.state.core._attempts == {}


def test_a_changed_number_stops_recovery_by_its_line(tmp_path: Path) -> None:
    """Found by the generated damage (stop 43): a digit changed after the write still parsed,
    and replay rebuilt another state in silence. Each line carries its CRC-32 now."""
    run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    lines = segment.read_bytes().split(b"\n")
    assert b'"now":2.0' in lines[2]
    lines[2] = lines[2].replace(b'"now":2.0', b'"now":7.0')
    segment.write_bytes(b"\n".join(lines))
    with pytest.raises(WalCorruptError, match=rf"{segment.name}:3: not a write-ahead-log record \(its checksum"):
        list(read_records(tmp_path, 0))


def test_a_missing_first_line_is_named(tmp_path: Path) -> None:
    """Found by the generated damage (stop 43): the log's first lines could go unnoticed (the
    sequence was checked only from the first line there was)."""
    run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    segment.write_bytes(segment.read_bytes().split(b"\n", 1)[1])
    with pytest.raises(WalCorruptError, match="its first record is seq 2, not 1; records are missing"):
        list(read_records(tmp_path, 0))


def test_a_log_written_before_checksums_still_replays(tmp_path: Path) -> None:
    live = run_events(tmp_path)
    segment = next(tmp_path.glob("wal-*.jsonl"))
    lines = [json.loads(line) for line in segment.read_bytes().splitlines()]
    segment.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "crc32"}) + "\n" for r in lines))
    replayed = driver({"a": 8, "b": 8}, node_count=3)
    for record in read_records(tmp_path, 0):
        inputs.apply(replayed, record)
    assert canonical(replayed) == canonical(live)


def test_a_changed_snapshot_is_named(tmp_path: Path) -> None:
    d = driver({"a": 8, "b": 8}, node_count=3)
    wal = WriteAheadLog(tmp_path, 0)
    wal.wait_durable(wal.append(inputs.submit(submission("w", "a", 8, "training"), 1.0, "r")))
    document, seq = snapshot_document(d, wal, 2.0)
    path = write_snapshot(SnapshotFiles(tmp_path), document, seq)
    wal.close()
    path.write_bytes(path.read_bytes().replace(b'"wal_seq":1', b'"wal_seq":0'))
    with pytest.raises(WalCorruptError, match=rf"{path.name}: its checksum does not match"):
        recover(tmp_path, SchedulerJournal(tmp_path / "scheduler.db"), lambda s: Driver(s))


class _FullDisk:
    """A segment file whose next write stores only half of what it is given."""

    def __init__(self, file: Any) -> None:
        self.file, self.name = file, file.name

    def write(self, data: bytes) -> int:
        written: int = self.file.write(data[: len(data) // 2])
        return written

    def fileno(self) -> int:
        return int(self.file.fileno())

    def close(self) -> None:
        self.file.close()


def test_a_record_the_disk_cut_short_is_raised_and_leaves_no_fragment(tmp_path: Path) -> None:
    """Found reading the log (stop 43): `append` ignored how much `write` stored, so a full
    disk left half a line that the next record extended into one line that stops recovery,
    and the event the driver had applied was answered as logged. Now the fragment is cut and
    the failure goes to `on_broken` (the live scheduler exits there, to restart from the log)."""
    wal = WriteAheadLog(tmp_path, 0)
    wal.wait_durable(wal.append(inputs.tick(1.0)))
    broken: list[str] = []

    def stop(error: Exception) -> NoReturn:
        broken.append(str(error))
        raise error

    wal.on_broken = stop
    wal._file = _FullDisk(wal._file)  # type: ignore[assignment]
    with pytest.raises(WalWriteError, match="record 2 was cut short; it is not logged"):
        wal.append(inputs.tick(2.0))
    assert len(broken) == 1
    wal.close()
    assert [r["now"] for r in read_records(tmp_path, 0)] == [1.0]  # whole: recovery goes on from here
