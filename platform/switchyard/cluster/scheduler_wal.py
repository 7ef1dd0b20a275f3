"""The live scheduler's write-ahead log and snapshots, on the head node's disk.

Layout, in `<state>/scheduler-wal/`:

- `wal-<first seq>.jsonl`: the driver's input events (`scheduler.driver.inputs`), one JSON
  line each, `{"seq": N, "event": ..., "now": ..., ...}`, seq rising by one across segments.
- `snapshot-<seq>.json`: the state after record `seq` (`scheduler.driver.snapshot`), written to
  a temporary file, fsynced and renamed, so a snapshot file is whole or absent.

Fsync policy: group commit. `append` writes the line (the caller holds the actor's lock, so
lines are in event order); `wait_durable(seq)` returns once an `fdatasync` that began after
line `seq` was written has finished. One caller syncs for everyone waiting, so concurrent calls
share a sync; nobody is answered before the sync that covers their line. A snapshot starts a
new segment; segments and snapshots older than the newest snapshot are removed after it is on
disk.

Checksums: each line, and each snapshot, ends with `"crc32": N`, the CRC-32 of the bytes
before it (the object as written without that field). A byte changed after the write (a
number that still parses, a name) would otherwise replay as another state; with it, the line
stops recovery by name. Lines and snapshots written before checksums have none and are read
as they are, but a segment whose first line carries one must carry one on every line.

Reading back: a last line cut short by a crash mid-append (no newline, or not JSON) was never
acknowledged; it is dropped with a warning and cut from the file. Any other bad line stops
recovery with its file and line number, and nothing is deleted.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO, NamedTuple, NoReturn

from switchyard.sealed_json import sealed, unsealed

log = logging.getLogger(__name__)

Record = dict[str, Any]


class WalCorruptError(RuntimeError):
    """A write-ahead-log line that is not a record, or a gap in the sequence."""


class SealedLine(NamedTuple):
    """A record as the log's next line (`WriteAheadLog.seal`), not written yet."""

    seq: int
    data: bytes


class WalWriteError(RuntimeError):
    """A line could not be written whole, or a sync failed: the caller's state is ahead of
    its log, and only a restart from the log (what was durable) is consistent again."""


def _segment_path(directory: Path, first_seq: int) -> Path:
    return directory / f"wal-{first_seq:012d}.jsonl"


def _numbered(directory: Path, prefix: str, suffix: str) -> list[tuple[int, Path]]:
    found = []
    for p in directory.glob(f"{prefix}*{suffix}"):
        digits = p.name[len(prefix) : -len(suffix)]
        if digits.isdigit():
            found.append((int(digits), p))
    return sorted(found)


class WriteAheadLog:
    """Appends records after `last_seq`, in a new segment. Thread-safe."""

    def __init__(self, directory: Path, last_seq: int) -> None:
        """`on_broken`, settable: what a `WalWriteError` does (default: raise it); the live
        scheduler stops its process there, so Ray restarts it from the log."""
        self.on_broken: Callable[[WalWriteError], NoReturn] = _raise
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self._sync = threading.Condition()
        self._appended = last_seq
        self._durable = last_seq
        self._syncing = False
        self._file = self._open(last_seq + 1)

    @property
    def last_seq(self) -> int:
        return self._appended

    def _open(self, first_seq: int) -> BinaryIO:
        f = open(_segment_path(self.directory, first_seq), "ab", buffering=0)  # noqa: SIM115 - held open
        _fsync_directory(self.directory)
        return f

    def seal(self, record: Record) -> SealedLine:
        """`record` as the next line, not written yet. Raises ValueError naming the event for a
        record JSON cannot hold (a non-finite number, bytes): the live scheduler seals an event
        before it applies it, so an event the log cannot hold changes nothing."""
        with self._sync:
            seq = self._appended + 1
        try:
            return SealedLine(seq, sealed({"seq": seq, **record}) + b"\n")
        except (TypeError, ValueError) as exc:  # json.dumps: TypeError for a type, ValueError for NaN
            raise ValueError(f"a {record.get('event')!r} event the log cannot hold: {exc}") from None

    def append(self, record: Record) -> int:
        """Write `record` as the next line; returns its seq. Not durable until `wait_durable`."""
        with self._sync:  # reentrant (a Condition's default lock): no line comes between the two
            return self.write(self.seal(record))

    def write(self, sealed_line: SealedLine) -> int:
        """Write a line `seal` made, as the next one; returns its seq. Not durable until
        `wait_durable`. The caller holds its lock from `seal` to here, so no line comes between."""
        with self._sync:
            seq, line = sealed_line
            if seq != self._appended + 1:
                raise AssertionError(f"a line sealed as record {seq} written after record {self._appended}")
            try:
                written = self._file.write(line)
            except OSError as exc:
                self.on_broken(WalWriteError(f"{self._file.name}: record {seq} was not written ({exc.strerror})"))
            if written != len(line):  # a full disk: no fragment may stay for the next line to extend
                os.ftruncate(self._file.fileno(), os.fstat(self._file.fileno()).st_size - (written or 0))
                self.on_broken(WalWriteError(f"{self._file.name}: record {seq} was cut short; it is not logged"))
            self._appended = seq
        return seq

    def wait_durable(self, seq: int) -> None:
        with self._sync:
            while self._durable < seq:
                if self._syncing:
                    self._sync.wait()
                    continue
                self._syncing, target, fd = True, self._appended, self._file.fileno()
                self._sync.release()
                try:
                    os.fdatasync(fd)
                except OSError as exc:  # the kernel may have dropped the pages: no retry can tell
                    self.on_broken(WalWriteError(f"{self._file.name}: fdatasync failed ({exc.strerror})"))
                finally:
                    self._sync.acquire()
                    self._syncing = False
                    self._sync.notify_all()
                self._durable = max(self._durable, target)

    def start_segment(self) -> None:
        """Sync and close the current segment; later records go to a new one (at a snapshot)."""
        with self._sync:
            while self._syncing:
                self._sync.wait()
            os.fdatasync(self._file.fileno())
            self._durable = self._appended
            self._file.close()
            self._file = self._open(self._appended + 1)

    def close(self) -> None:
        with self._sync:
            self._file.close()


def read_records(directory: Path, after_seq: int) -> Iterator[Record]:
    """The records after `after_seq`, in order. Raises WalCorruptError (see the module doc)."""
    segments = _numbered(directory, "wal-", ".jsonl")
    expected: int | None = None
    for index, (first_seq, path) in enumerate(segments):
        last_segment = index == len(segments) - 1
        for record in _segment_records(path, last_segment):
            seq = record["seq"]
            if expected is None and seq != first_seq:  # the file is named after its first record
                raise WalCorruptError(f"{path}: its first record is seq {seq}, not {first_seq}; records are missing")
            if expected is not None and seq != expected:
                raise WalCorruptError(f"{path}: record seq {seq} follows {expected - 1}; records are missing")
            if seq > after_seq:
                if seq != after_seq + 1 and (expected is None or expected <= after_seq):
                    raise WalCorruptError(  # a whole segment after the snapshot is gone
                        f"{path}: the log resumes at seq {seq} after record {after_seq}; records are missing"
                    )
                yield record
            expected = seq + 1


def _segment_records(path: Path, last_segment: bool) -> Iterator[Record]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: what follows the last newline
    checked: bool | None = None  # whether this segment's lines carry checksums (its first line says)
    for number, line in enumerate(complete, start=1):
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError("not a JSON object")
            record, has_checksum = unsealed(record)
            checked = has_checksum if checked is None else checked
            if checked and not has_checksum:
                raise ValueError("no checksum, in a segment whose lines carry one")
            if not isinstance(record.get("seq"), int):
                raise ValueError("not a record with a seq")
        except ValueError as exc:
            if last_segment and number == len(complete) and not tail:
                _drop_torn_tail(path, data, len(data) - len(line) - 1, f"line {number} ({exc})")
                return
            raise WalCorruptError(f"{path}:{number}: not a write-ahead-log record ({exc}); recovery stopped") from exc
        yield record
    if tail:
        if not last_segment:
            raise WalCorruptError(f"{path}:{len(complete) + 1}: a line cut short in a segment that is not the last")
        _drop_torn_tail(path, data, len(data) - len(tail), f"line {len(complete) + 1} (no newline)")


def _drop_torn_tail(path: Path, data: bytes, keep: int, what: str) -> None:
    log.warning("%s: dropping %s, cut short by a crash mid-append (never acknowledged)", path, what)
    with open(path, "r+b") as f:
        f.truncate(keep)
        os.fsync(f.fileno())


class SnapshotFiles:
    """`snapshot-<seq>.json` files: written whole or not at all."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)

    def write(self, document: bytes, seq: int) -> Path:
        path = self.directory / f"snapshot-{seq:012d}.json"
        partial = path.with_suffix(".json.partial")
        with open(partial, "wb") as f:
            f.write(document)
            os.fsync(f.fileno())
        os.replace(partial, path)
        _fsync_directory(self.directory)
        return path

    def latest(self) -> tuple[Path, dict[str, Any]] | None:
        found = _numbered(self.directory, "snapshot-", ".json")
        if not found:
            return None
        path = found[-1][1]
        try:
            document = json.loads(path.read_bytes())
        except ValueError as exc:
            raise WalCorruptError(f"{path}: not a JSON snapshot ({exc})") from exc
        if not isinstance(document, dict):
            raise WalCorruptError(f"{path}: not a snapshot document")
        try:
            return path, unsealed(document)[0]
        except ValueError as exc:
            raise WalCorruptError(f"{path}: {exc}; recovery stopped") from exc

    def remove_before(self, seq: int) -> None:
        """Snapshots older than the one after record `seq`, and segments it covers, go."""
        for taken, path in _numbered(self.directory, "snapshot-", ".json"):
            if taken < seq:
                path.unlink()
        segments = _numbered(self.directory, "wal-", ".jsonl")
        for (_, path), (next_first, _) in itertools.pairwise(segments):
            if next_first - 1 <= seq:
                path.unlink()


def _raise(error: WalWriteError) -> NoReturn:
    raise error


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
