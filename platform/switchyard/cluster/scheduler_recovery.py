"""Bringing the live scheduler back: the newest snapshot, then the log records after it.

The records go through the same `inputs.apply` as live calls; the event-log rows they imply
are written for the records the journal has not seen (`SchedulerJournal.last_wal_seq`). Cluster
actions (notices, stops, launches) of replayed records are not redone: as before the log, one
the crash cut off is recovered by the rules that cover a lost action (the claim timeout takes
back a grant whose launch never happened; the grace period stops a job that missed its notice).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_wal import SnapshotFiles, WriteAheadLog, read_records
from switchyard.scheduler.driver import Driver, LiveState, inputs
from switchyard.scheduler.driver.effects import JournalEvent
from switchyard.scheduler.driver.snapshot import from_document, to_document
from switchyard.sealed_json import sealed

log = logging.getLogger(__name__)


class ReplayDivergedError(RuntimeError):
    """A logged event the driver refused on replay: the log and the code disagree."""


@dataclass
class Recovered:
    driver: Driver
    wal: WriteAheadLog
    snapshot_seq: int
    replayed: int
    migrated_legacy: bool
    last_time: float  # the latest time the snapshot or a replayed record holds (-inf: none)


def recover(directory: Path, journal: SchedulerJournal, driver_of: Callable[[LiveState | None], Driver]) -> Recovered:
    """`driver_of(state)`: the driver over a restored state (None: an empty one)."""
    files = SnapshotFiles(directory)
    latest = files.latest()
    legacy = False
    last_time = -math.inf
    if latest is not None:
        snap = from_document(latest[1], str(latest[0]))
        driver, seq, last_time = driver_of(snap.state), snap.wal_seq, _finite(snap.taken_at)
    else:
        restored = journal.legacy_state()
        legacy = restored is not None
        driver, seq = driver_of(restored), 0
    journaled, base = journal.last_wal_seq(), seq
    replayed = 0
    for record in read_records(directory, seq):
        try:
            _, effects = inputs.apply(driver, record)
        except (ValueError, KeyError) as exc:
            raise ReplayDivergedError(f"{directory}: replay of record {record['seq']} failed: {exc!r}") from exc
        seq, replayed = record["seq"], replayed + 1
        last_time = max(last_time, _time_of(record))
        if seq > journaled:
            for e in effects:
                if isinstance(e, JournalEvent):
                    journal.event(e.kind.value, e.workload_id, e.team, e.at, wal_seq=seq, **e.details)
    return Recovered(driver, WriteAheadLog(directory, seq), base, replayed, legacy, last_time)


def _time_of(record: dict[str, object]) -> float:
    """The time a record was taken at (-inf for the few that carry none: a claim)."""
    now = record.get("now")
    return _finite(now) if isinstance(now, int | float) and not isinstance(now, bool) else -math.inf


def _finite(time: float) -> float:
    return float(time) if math.isfinite(time) else -math.inf


def write_snapshot(files: SnapshotFiles, document: dict[str, object], seq: int) -> Path:
    """Write the document taken after record `seq`, then drop what it makes redundant."""
    path = files.write(sealed(document, allow_nan=True), seq)
    files.remove_before(seq)
    return path


def snapshot_document(driver: Driver, wal: WriteAheadLog, now: float) -> tuple[dict[str, object], int]:
    """Caller holds the actor's lock: the state after the last record, and a new segment."""
    seq = wal.last_seq
    document = to_document(driver.state, seq, now)
    wal.start_segment()
    return document, seq
