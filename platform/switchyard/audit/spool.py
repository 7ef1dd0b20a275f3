"""The asynchronous path for low- and medium-risk flows: a per-writer spool file, drained.

`put` appends one line to the writer's spool file with a single `write(2)` and returns; a
background task moves batches into the SQLite store every `drain_interval_s` and deletes
the drained file. Loss bound (see docs/audit.md):

- a process crash (SIGKILL, OOM) loses nothing acknowledged: the lines are in the kernel's
  page cache; the next `AuditSpool.start()` on the host (any replica) or
  `switchyard audit drain` finds the dead writer's files (its lock is free) and drains them;
- a host crash loses at most what was acknowledged but not yet committed: the records of the
  last `drain_interval_s` (plus one drain's duration), never more than `max_backlog` records.

When the backlog reaches `max_backlog` (the store is down or slow), `put` waits up to
`full_wait_s` and then raises `AuditUnavailable`: a record is refused loudly, never dropped.

A stream is answered before its record can exist, so a replica killed while its client reads
a stream would leave a request the client saw and the audit log never did (found in CI). So
`open_stream` writes the record the request gets if its replica dies first (cut off by the
replica's loss, charged its whole reservation) to the writer's `<writer>.open` file before
the first byte; the request's real record supersedes it (`close_stream`), and only a dead
writer's unsuperseded ones reach the store, after its spool files, where a request's first
record wins.

A stand-in is written before its stream's charge is known and restated after, but a death
can fall between the charge journal's line and the restatement. So when the writer's charges
are journaled under its name (a gateway replica's), a recovered stand-in states what the
ledger charged its request, and waits while the dead writer's charge journal is still on the
host (`LedgerView`): the ledger, not the order of two writes, decides the record's cost.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from switchyard.audit.builder import BodyBlob, PendingEntry, bill_record
from switchyard.audit.record import BillRecord, RequestRecord, canonical_json
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import b64, unb64
from switchyard.budgets.ledger import Charge
from switchyard.budgets.money import nanos_to_usd
from switchyard.gateway.seams import AuditUnavailable, Bill, Usage
from switchyard.sealed_json import UNREADABLE, has_checksums, keep_aside, sealed_bytes, unsealed_bytes

log = logging.getLogger(__name__)

BATCH = 500  # entries per store transaction while draining
OPEN_STREAMS = ".open"  # `<writer>.open`: the stand-in records of a writer's streams in flight


def encode_line(pending: PendingEntry) -> bytes:
    """`{"record": <canonical JSON>, "bodies": [...], "crc32": N}`: the record's canonical text is
    embedded as it is (it is compact JSON already), not parsed back and encoded a second time;
    the checksum covers the line's bytes before it (`switchyard.sealed_json`). The chain hashes
    a record only once it is drained, so before that the checksum is what shows a byte changed
    on disk (a digit of a cost, a team), which would otherwise be stored and chained as written."""
    bodies = json.dumps([{"part": b.part, "data": b64(b.data)} for b in pending.bodies], separators=(",", ":"))
    return sealed_bytes(f'{{"record":{canonical_json(pending.record)},"bodies":{bodies}}}'.encode()) + b"\n"


def decode_line(line: bytes, checked: bool = False) -> PendingEntry:
    """Raises ValueError for a line that is not a whole, unchanged spooled record. `checked`:
    its file was written with checksums (`has_checksums`), so a line without one was changed.
    Lines written before checksums have none and are read as they are."""
    body, had_checksum = unsealed_bytes(line.removesuffix(b"\n"))
    if checked and not had_checksum:
        raise ValueError("no checksum, in a file written with them")
    try:
        data = json.loads(body)
        if set(data) != {"record", "bodies"}:
            raise ValueError(f"unexpected fields {sorted(data)}")
        bodies = tuple(BodyBlob(b["part"], unb64(b["data"])) for b in data["bodies"])
        return PendingEntry(RequestRecord.model_validate(data["record"]), bodies)
    except (KeyError, TypeError) as exc:  # JSON, but not of a spooled record's shape
        raise ValueError(f"not a spooled record ({type(exc).__name__})") from None


@dataclass(frozen=True)
class DrainReport:
    files: int
    lines: int
    new_entries: int  # lines already in the store (a drain interrupted after commit) are not new
    torn_lines: int  # a partial last line: its `put` never returned, so no response depended on it
    kept: int = 0  # stand-in files left for a later recovery (their charges are not in the ledger yet)
    unreadable: int = 0  # other lines that are no record: kept aside (`UNREADABLE`), never dropped


class LedgerView(Protocol):
    """The budget side of a dead writer's streams, for writers that journal their charges
    under their own name (`switchyard.budgets.charge_journal.ChargesOnHost`)."""

    def journal_left(self, writer: str) -> bool:
        """Whether `writer`'s charge journal is still on the host (charges not yet in the ledger)."""
        ...

    def charged(self, request_ids: Sequence[str]) -> Mapping[str, Sequence[Charge]]:
        """The ledger's charges of each request, first to last; absent if it has none."""
        ...


def drain_file(path: Path, store: AuditStore) -> DrainReport:
    """Move one spool file into the store, then delete it. Safe to repeat (entries are unique)."""
    entries, torn, unreadable = _decode_lines(path)
    new = 0
    for start in range(0, len(entries), BATCH):
        new += store.append(entries[start : start + BATCH])
    keep_aside(path, unreadable)
    path.unlink()
    return DrainReport(1, len(entries), new, torn, unreadable=len(unreadable))


def _decode_lines(path: Path) -> tuple[list[PendingEntry], int, list[bytes]]:
    """The records of a spool or stand-ins file; how many lines were torn (a last line without
    its newline: a write a crash cut short, never acknowledged, dropped); and the other lines
    that are no record. Those cannot come from a crash (each line is one `write(2)`, newline
    last), so something changed the file: the caller keeps them aside (`keep_aside`), and
    they are logged as an error. Logged by position only: a line may hold a body and must not
    reach the logs."""
    entries: list[PendingEntry] = []
    content = path.read_bytes()
    lines, checked = content.split(b"\n"), has_checksums(content)
    torn, unreadable = 0, []
    for number, raw in enumerate(lines, start=1):
        if not raw:
            continue
        try:
            entries.append(decode_line(raw, checked))
        except ValueError:
            if number == len(lines):  # after the last newline
                log.warning("%s line %d is torn (%d bytes); its writer never acknowledged it", path, number, len(raw))
                torn += 1
            else:
                unreadable.append(raw)
                log.error(
                    "%s line %d (%d bytes) is no audit record; kept aside in %s%s",
                    path,
                    number,
                    len(raw),
                    path.name,
                    UNREADABLE,
                )
    return entries, torn, unreadable


def recover_open_streams(
    directory: Path, writer: str, store: AuditStore, ledger: LedgerView | None = None
) -> DrainReport:
    """A dead writer's streams that never got their own record: each gets its stand-in, at
    the cost the ledger charged it when `ledger` is given. Run after the writer's spool files
    are drained, so a record that did arrive wins."""
    path = directory / f"{writer}{OPEN_STREAMS}"
    (directory / f"{writer}{OPEN_STREAMS}.tmp").unlink(missing_ok=True)  # a compaction the death cut short
    if not path.exists():
        return DrainReport(0, 0, 0, 0)
    if ledger is not None and ledger.journal_left(writer):
        log.warning("the stand-ins of dead writer %s wait for its charge journal to reach the ledger", writer)
        return DrainReport(0, 0, 0, 0, kept=1)
    entries, torn, unreadable = _decode_lines(path)
    latest = {e.record.request_id: e for e in entries}  # a restated stand-in (after its charge) wins
    if ledger is not None and latest:
        try:
            charged = ledger.charged(list(latest))
        except Exception:  # whatever the ledger's transport raises (Ray, a database): nothing is dropped
            log.exception("cannot read the ledger's charges of dead writer %s's streams; kept for later", writer)
            return DrainReport(0, 0, 0, torn, kept=1)
        latest = {rid: _as_charged(e, charged.get(rid, ())) for rid, e in latest.items()}
    new = store.append(list(latest.values())) if latest else 0
    if new:
        log.warning("%d streams of dead writer %s were cut off by its death; recorded as replica_lost", new, writer)
    keep_aside(path, unreadable)
    path.unlink()
    return DrainReport(1, len(entries), new, torn, unreadable=len(unreadable))


def _as_charged(stand_in: PendingEntry, charges: Sequence[Charge]) -> PendingEntry:
    """The stand-in with the ledger's charges of its request as its bills and cost."""
    if not charges:
        # Its journal reached the ledger without it: lost in a host crash (docs/budgets.md).
        log.warning("the ledger has no charge for stream %s; its record states none", stand_in.record.request_id)
    bills = tuple(_charge_record(c) for c in charges)
    if _same_bills(bills, stand_in.record.bills):  # charged as the stand-in says: its bases hold
        bills = stand_in.record.bills
    cost = nanos_to_usd(sum(c.nanos for c in charges))
    return PendingEntry(stand_in.record.model_copy(update={"cost_usd": cost, "bills": bills}), stand_in.bodies)


def _charge_record(charge: Charge) -> BillRecord:
    """A ledger charge as a bill; its basis is not known: the ledger keeps the charge alone."""
    usage = Usage(charge.prompt_tokens, charge.completion_tokens, charge.cached_tokens)
    return bill_record(Bill(charge.model, usage, charge.nanos, basis=None))


def _same_bills(charged: Sequence[BillRecord], stated: Sequence[BillRecord]) -> bool:
    """The ledger's charges are the bills the stand-in states, all but what they were charged at."""
    return [b.model_copy(update={"basis": None}) for b in stated] == list(charged)


def recover_orphans(directory: Path, store: AuditStore, ledger: LedgerView | None = None) -> DrainReport:
    """Drain every spool whose writer is gone (its lock is not held, or its lock file is gone).
    Who drains after a crash: whichever process calls this first, i.e. the next sink to start
    on the host, or `switchyard audit drain`. Recoveries are serialised by `.recovery`.
    `ledger`: stand-ins get their requests' charges (see `recover_open_streams`)."""
    reports: list[DrainReport] = []
    guard = os.open(directory / ".recovery", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(guard, fcntl.LOCK_EX)
        live: set[str] = set()
        done: set[str] = set()  # writers recovered in this pass (their stand-ins may be kept)
        for lock_path in sorted(directory.glob("*.lock")):
            fd = os.open(lock_path, os.O_RDWR)
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    live.add(lock_path.stem)
                    continue
                reports.extend(_drain_writer(directory, lock_path.stem, store, ledger))
                done.add(lock_path.stem)
                lock_path.unlink()
            finally:
                os.close(fd)
        # A writer's lock file exists before its first spool file (see `AuditSpool.start`), so
        # a spool without one belongs to a dead writer whose recovery was interrupted.
        for spool in sorted(directory.glob("*.spool")):
            writer = spool.name.rsplit(".", 2)[0]
            if writer not in live | done and not (directory / f"{writer}.lock").exists():
                reports.extend(_drain_writer(directory, writer, store, ledger))
                done.add(writer)
        for stand_ins in sorted(directory.glob(f"*{OPEN_STREAMS}")):
            writer = stand_ins.name.removesuffix(OPEN_STREAMS)
            if writer not in live | done and not (directory / f"{writer}.lock").exists():
                reports.append(recover_open_streams(directory, writer, store, ledger))
    finally:
        os.close(guard)
    total = DrainReport(
        sum(r.files for r in reports),
        sum(r.lines for r in reports),
        sum(r.new_entries for r in reports),
        sum(r.torn_lines for r in reports),
        sum(r.kept for r in reports),
        sum(r.unreadable for r in reports),
    )
    if total.files:
        log.info(
            "recovered %d spool files of dead writers: %d records (%d new, %d torn, %d unreadable kept aside)",
            total.files,
            total.lines,
            total.new_entries,
            total.torn_lines,
            total.unreadable,
        )
    return total


def _drain_writer(directory: Path, writer: str, store: AuditStore, ledger: LedgerView | None) -> list[DrainReport]:
    spools = [drain_file(spool, store) for spool in sorted(directory.glob(f"{writer}.*.spool"), key=_spool_number)]
    return [*spools, recover_open_streams(directory, writer, store, ledger)]


def pending_lines(directory: Path) -> int:
    """Records spooled but not yet in the store, over every writer on the host."""
    return sum(p.read_bytes().count(b"\n") for p in directory.glob("*.spool"))


def _spool_number(path: Path) -> int:
    return int(path.name.rsplit(".", 2)[1])


class AuditSpool:
    def __init__(
        self,
        directory: Path,
        store: AuditStore,
        drain_interval_s: float = 0.2,
        max_backlog: int = 10_000,
        full_wait_s: float = 2.0,
        on_backlog: Callable[[int], None] | None = None,
        writer_id: str | None = None,
        ledger: LedgerView | None = None,
    ) -> None:
        """`writer_id`: the name of this process's charge journal, if it has one (a dead
        writer's stand-ins are then matched to its charges through `ledger`)."""
        self.directory = directory
        self.store = store
        self.drain_interval_s = drain_interval_s
        self.max_backlog = max_backlog
        self.full_wait_s = full_wait_s
        self._on_backlog = on_backlog
        self.ledger = ledger
        self.writer_id = writer_id or f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self._number = 0
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._backlog = 0  # lines written to spool files not yet committed to the store
        self._drained = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._streams: dict[str, tuple[bytes, bool]] = {}  # request id -> (stand-in line, durable)
        self._streams_fd: int | None = None
        self._closed_streams = 0  # superseded stand-ins still in the file

    @property
    def backlog(self) -> int:
        return self._backlog

    @property
    def started(self) -> bool:
        return self._fd is not None

    async def start(self) -> DrainReport:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        report = await asyncio.to_thread(recover_orphans, self.directory, self.store, self.ledger)
        # Locked under a private name, then renamed: a recoverer can never see the lock file
        # unlocked and take this live writer for a dead one.
        private = self.directory / f".{self.writer_id}.lock.new"
        self._lock_fd = os.open(private, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        private.rename(self.directory / f"{self.writer_id}.lock")
        self._open_next()
        self._task = asyncio.create_task(self._drain_forever(), name=f"audit-spool-{self.writer_id}")
        return report

    def _path(self, number: int) -> Path:
        return self.directory / f"{self.writer_id}.{number}.spool"

    def _open_next(self) -> None:
        self._number += 1
        self._fd = os.open(self._path(self._number), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    async def put(self, pending: PendingEntry) -> None:
        if self._fd is None:
            raise RuntimeError("AuditSpool.put before start()")
        deadline = time.monotonic() + self.full_wait_s
        while self._backlog >= self.max_backlog:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AuditUnavailable(
                    f"audit spool backlog is full ({self._backlog} records not yet stored); refusing the record"
                )
            self._drained.clear()
            try:
                await asyncio.wait_for(self._drained.wait(), timeout=left)
            except TimeoutError:
                continue
        line = encode_line(pending)
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            raise AuditUnavailable(f"cannot write the audit spool {self._path(self._number)}: {exc.strerror}") from exc
        if written != len(line):
            # The part written is this file's last line now, torn: the next record goes to a
            # new file, or it would extend that fragment into one unreadable line.
            short = self._path(self._number)
            os.close(self._fd)
            self._open_next()
            raise AuditUnavailable(f"short write to the audit spool {short}")
        self._set_backlog(self._backlog + 1)

    # ------------------------------------------------------------ streams in flight

    def _streams_path(self) -> Path:
        return self.directory / f"{self.writer_id}{OPEN_STREAMS}"

    async def open_stream(self, stand_in: PendingEntry, durable: bool) -> None:
        """Before a stream's first byte: the record its request gets if this writer dies
        before `close_stream`. `durable`: on stable storage before this returns."""
        if self._fd is None:
            raise RuntimeError("AuditSpool.open_stream before start()")
        if self._streams_fd is None:
            self._streams_fd = os.open(self._streams_path(), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        line = encode_line(stand_in)
        try:
            size = os.fstat(self._streams_fd).st_size
            if os.write(self._streams_fd, line) != len(line):
                # Cut the fragment, which the next line would extend. (Rewriting the whole file
                # to drop it, as before, needs the space the disk just refused.)
                os.ftruncate(self._streams_fd, size)
                raise AuditUnavailable(f"short write to {self._streams_path()}")
            if durable:
                await asyncio.to_thread(os.fsync, self._streams_fd)
        except OSError as exc:
            raise AuditUnavailable(f"cannot write {self._streams_path()}: {exc.strerror}") from exc
        self._streams[stand_in.record.request_id] = (line, durable)

    def close_stream(self, request_id: str) -> None:
        """The request's own record is stored or spooled: its stand-in is void."""
        if self._streams.pop(request_id, None) is not None:
            self._closed_streams += 1

    @property
    def open_streams(self) -> int:
        return len(self._streams)

    def compact_streams(self) -> None:
        """Rewrite the stand-ins file without the superseded ones (written aside, then renamed
        over: a death midway leaves the old file, a superset, which recovery handles)."""
        if self._closed_streams and self._streams_fd is not None:
            self._rewrite_streams()

    def _rewrite_streams(self) -> None:
        """The stand-ins file as `_streams` holds it (caller: the file is open)."""
        assert self._streams_fd is not None
        path = self._streams_path()
        tmp = path.with_name(path.name + ".tmp")
        content = b"".join(line for line, _ in self._streams.values())
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            written = os.write(fd, content) if content else 0
            if written != len(content):
                raise OSError(f"{written} of {len(content)} bytes written")
            if any(durable for _, durable in self._streams.values()):
                os.fsync(fd)
        except OSError as exc:
            # The old file stays: a superset, which recovery handles. Renaming the partial
            # file over it lost the stand-ins of streams still open (before stop 44).
            os.close(fd)
            tmp.unlink(missing_ok=True)
            log.error("audit stand-ins %s: not compacted (%s); it keeps every stand-in it had", path, exc)
            return
        os.close(fd)
        tmp.rename(path)
        os.close(self._streams_fd)
        self._streams_fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        self._closed_streams = 0

    def _set_backlog(self, value: int) -> None:
        self._backlog = value
        if self._on_backlog is not None:
            self._on_backlog(value)

    async def drain_once(self) -> DrainReport:
        """Rotate to a new file and move the old one into the store."""
        if self._fd is None:
            return DrainReport(0, 0, 0, 0)
        old = self._path(self._number)
        os.close(self._fd)
        self._open_next()
        try:
            report = await asyncio.to_thread(drain_file, old, self.store)
        except Exception:
            # The file stays; the next drain (or a recovery) retries it. Logged, never dropped.
            log.exception("audit spool drain of %s failed; will retry", old)
            raise
        self._set_backlog(max(0, self._backlog - report.lines))
        self._drained.set()
        return report

    async def _drain_forever(self) -> None:
        while True:
            await asyncio.sleep(self.drain_interval_s)
            try:
                self.compact_streams()
                await self._drain_leftovers()
                await self.drain_once()
            except Exception as exc:  # noqa: BLE001 - the loop must survive a store outage
                log.error("audit spool drain failed (%s); backlog %d", type(exc).__name__, self._backlog)

    async def _drain_leftovers(self) -> None:
        """Files of this writer that a failed drain left behind, oldest first."""
        for path in sorted(self.directory.glob(f"{self.writer_id}.*.spool"), key=_spool_number):
            if _spool_number(path) == self._number:
                break
            report = await asyncio.to_thread(drain_file, path, self.store)
            self._set_backlog(max(0, self._backlog - report.lines))

    async def stop(self) -> None:
        """Drain everything and release the writer's lock."""
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                log.debug("audit spool drain task stopped")
        await self._drain_leftovers()
        await self.drain_once()
        if self._streams_fd is not None:
            # Streams still open at shutdown (the caller drained its requests first, so none
            # normally): their stand-ins are all they will get.
            stand_ins = [decode_line(line) for line, _ in self._streams.values()]
            if stand_ins:
                log.warning("%d streams still open at shutdown; recorded as replica_lost", len(stand_ins))
                await asyncio.to_thread(self.store.append, stand_ins)
            self._streams.clear()
            os.close(self._streams_fd)
            self._streams_path().unlink(missing_ok=True)
            self._streams_fd = None
        if self._fd is not None:
            os.close(self._fd)
            self._path(self._number).unlink(missing_ok=True)
            self._fd = None
        if self._lock_fd is not None:
            (self.directory / f"{self.writer_id}.lock").unlink(missing_ok=True)
            os.close(self._lock_fd)
            self._lock_fd = None
