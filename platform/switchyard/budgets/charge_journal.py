"""A replica's write-ahead journal of charges it settled locally but has not yet sent.

The leased gate batches charges to the ledger (`LeaseConfig.flush_every_s`), so a replica
killed between a response and the next flush would take those charges with it: the ledger
would count less than was spent, and the hold's expiry would hand the money out again.
The journal closes that gap the way the audit spool does:

- `append` writes one line per charge with a single `write(2)` before the response is
  returned; a process crash (SIGKILL, OOM) loses nothing appended (the kernel has it);
- the writer holds an exclusive `flock` on its journal for its whole life; once every
  journaled charge has reached the ledger the file is truncated;
- `recover_orphans` (run by the next gate to start on the host, before it takes traffic)
  finds journals whose lock is free, sends their charges to their holds and deletes them.
  Charges are idempotent by id, so a charge sent before the crash is never counted twice.

A request killed with its replica before it settled (in flight at its provider, or halfway
through a stream its client was reading) would otherwise be charged nothing, although its
provider may have billed all of it. So `reserve` journals each reservation as a provisional
charge of its whole reserved amount (the request's upper bound), and the recovery charges
it unless the request settled (a charge with its id) or was released (nothing billed).

A host crash can still lose the last `flush_every_s` of charges (no fsync per request);
docs/budgets.md states the bound.

Each line carries its CRC-32 (`switchyard.sealed_json`): a digit of an amount changed on disk
would otherwise be charged as written. A complete line that is not a whole, unchanged entry
cannot come from a crash (each line is one `write(2)`), so recovery keeps it aside, as it was,
in `<journal>.unreadable` for an operator, sends the rest and says how many it kept aside.
A settled charge kept aside leaves its request's reservation standing: recovery charges the
reservation (the request's upper bound) in its place, so damage makes a charge larger, never
lost, while the reservation's line is in the file. Lines of journals written before checksums
have none and are read as they are; in a journal that has checksums, a line without one is
kept aside.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.budgets.ledger import Charge
from switchyard.sealed_json import UNREADABLE, has_checksums, keep_aside, sealed, unsealed

log = logging.getLogger(__name__)

SUFFIX = ".charges"

SendCharges = Callable[[str, Sequence[Charge]], Awaitable[object]]
"""`(hold_id, charges) -> ...`: record charges against a hold and close it."""


def _fields(charge: Charge) -> dict[str, object]:
    # A charge's fields are plain values: its instance dict, not `dataclasses.asdict`, whose
    # recursive copy was most of a journal line's cost (two lines per request).
    return dict(vars(charge))


def _line(entry: dict[str, object]) -> bytes:
    return sealed(entry) + b"\n"


def journal_dir(state_dir: str | Path) -> Path:
    """Where the gateway replicas of a host journal their charges, under its state directory."""
    return Path(state_dir) / "budgets" / "journal"


def journal_name(holder: str) -> str:
    """The journal's name (its file is `<name>.charges`): the holder id in safe characters.
    A gateway replica names its audit spool the same, so that a dead replica's streams can be
    matched to its charges (`ChargesOnHost`)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in holder)  # holders are `host:pid:uuid`


def journal_left(directory: Path, name: str) -> bool:
    """Whether the journal `name` is still in `directory`: some of its charges may not have
    reached the ledger (its writer is alive, or dead and not yet recovered)."""
    return (directory / f"{name}{SUFFIX}").exists()


class ChargeJournal:
    def __init__(self, directory: Path, holder: str) -> None:
        self.directory = directory
        self.name = journal_name(holder)
        self.path = directory / f"{self.name}{SUFFIX}"
        self._fd: int | None = None
        self._reserved: dict[str, bytes] = {}  # request id -> its provisional line, while open

    def open(self) -> None:
        """Create and lock the journal. Locked under a private name, then renamed, so a
        recoverer never finds it unlocked and takes this live writer for a dead one."""
        if self._fd is not None:
            return
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        private = self.directory / f".{self.path.name}.new"
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        private.rename(self.path)
        self._fd = fd

    def _write(self, entry: dict[str, object]) -> bytes:
        if self._fd is None:
            self.open()
        assert self._fd is not None
        line = _line(entry)
        # A line that cannot be written is logged, not raised: the charge is in memory and
        # reaches the ledger at the next flush (the journal is for a crash before it), and a
        # raise would leave the settlement half done. A reservation's line is written again by
        # the next `rewrite` or `clear`.
        try:
            written = os.write(self._fd, line)
        except OSError as exc:
            log.error(
                "charge journal %s: a line was not written (%s); a crash before the next flush loses it",
                self.path,
                exc.strerror,
            )
            return line
        if written != len(line):  # a full disk: cut the fragment, or the next line would extend it
            os.ftruncate(self._fd, os.fstat(self._fd).st_size - written)
            log.error("charge journal %s: a short write; the line is not journaled until the next flush", self.path)
        return line

    def append(self, hold_id: str, charge: Charge) -> None:
        """A settled charge (the first of a request's charges is named by its request id)."""
        self._write({"hold": hold_id, "charge": _fields(charge)})

    def reserve(self, hold_id: str, provisional: Charge) -> None:
        """A request's reservation, before its provider is called: `provisional` is named by
        the request id and worth the whole reservation."""
        self._reserved[provisional.charge_id] = self._write({"hold": hold_id, "provisional": _fields(provisional)})

    def settled(self, request_id: str) -> None:
        """The request's charges are journaled (after `append`): they supersede its reservation."""
        self._reserved.pop(request_id, None)

    def released(self, request_id: str) -> None:
        """The request was billed nothing: its reservation is void."""
        if self._reserved.pop(request_id, None) is not None:
            self._write({"released": request_id})

    def size_bytes(self) -> int:
        return os.fstat(self._fd).st_size if self._fd is not None else 0

    def rewrite(self, unsent: Sequence[tuple[str, Charge]]) -> None:
        """Replace the journal by what it still has to cover: `unsent` (hold id, charge) pairs,
        the charges not yet acknowledged by the ledger (the caller's), and the reservations of
        requests still open. Under steady load the journal is never all sent at once, so
        `clear` alone let it grow by two lines a request."""
        if self._fd is None:
            return
        lines = [_line({"hold": hold, "charge": _fields(charge)}) for hold, charge in unsent]
        self._replace(b"".join([*lines, *self._reserved.values()]))

    def clear(self) -> None:
        """Every journaled charge is in the ledger: start over (the caller guarantees it),
        keeping the reservations of requests still open."""
        if self._fd is None:
            return
        if self._reserved:
            self._replace(b"".join(self._reserved.values()))
        else:
            os.ftruncate(self._fd, 0)

    def _replace(self, content: bytes) -> None:
        """Make `content` the journal: written aside, locked, then renamed over, so a recoverer
        always finds the journal locked, and a death midway leaves the old file, a superset
        (its extra charges reached the ledger already, which counts each id once). A write that
        fails or is cut short (a full disk) keeps the old file too: truncating it in place and
        writing again, as `clear` did, lost the open reservations it had."""
        assert self._fd is not None
        private = self.directory / f".{self.path.name}.new"
        fd = os.open(private, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            written = os.write(fd, content) if content else 0
            if written != len(content):
                raise OSError(f"{written} of {len(content)} bytes written")
        except OSError as exc:
            os.close(fd)
            private.unlink(missing_ok=True)
            log.error("charge journal %s: not compacted (%s); it keeps every line it had", self.path, exc)
            return
        private.rename(self.path)
        os.close(self._fd)  # the old file's lock goes with it; the path is the new file already
        self._fd = fd

    def close(self) -> None:
        """Remove the journal; only once every charge in it has reached the ledger."""
        if self._fd is None:
            return
        self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._fd = None


@dataclass(frozen=True)
class RecoveryReport:
    journals: int
    charges: int
    torn_lines: int  # a partial last line: its request never got a response
    kept: int = 0  # journals whose charges could not be sent; left for the next recovery
    unreadable: int = 0  # complete lines that were no whole entry: kept aside (`UNREADABLE`)


def _request_of(charge_id: str) -> str:
    return charge_id.split(".", 1)[0]  # a request's charges: <id>, <id>.2, <id>.3 ...


@dataclass(frozen=True)
class JournalContent:
    """What one journal holds for the ledger."""

    by_hold: dict[str, list[Charge]]  # every settled charge, and each open request's reservation
    torn: int  # a last line without its newline: a write a crash cut short, never acknowledged
    unreadable: list[bytes]  # complete lines that are no whole, unchanged entry, as they were


def read_journal(content: bytes, path: Path) -> JournalContent:
    """The charges of one journal (`content`, read from `path`), grouped by hold: every settled
    charge, and the reservation of every request that neither settled nor was released."""
    by_hold: dict[str, dict[str, Charge]] = {}  # hold -> charge id -> charge: a doubled line is one charge
    provisional: dict[str, tuple[str, Charge]] = {}
    closed: set[str] = set()  # requests settled or released
    torn, unreadable = 0, []
    lines = content.split(b"\n")
    checked = has_checksums(content)  # written with them: every line must have one
    for number, raw in enumerate(lines, start=1):
        if not raw:
            continue
        try:
            entry = _entry(raw, checked)
            if "released" in entry:
                closed.add(str(entry["released"]))
            elif "provisional" in entry:
                charge = Charge(**entry["provisional"])
                provisional[charge.charge_id] = (str(entry["hold"]), charge)
            else:
                charge = Charge(**entry["charge"])
                by_hold.setdefault(str(entry["hold"]), {}).setdefault(charge.charge_id, charge)
                closed.add(_request_of(charge.charge_id))
        except (ValueError, KeyError, TypeError) as exc:
            if number == len(lines):  # after the last newline
                log.warning(
                    "charge journal %s line %d is torn (%d bytes); it was never acknowledged", path, number, len(raw)
                )
                torn += 1
            else:
                log.error(
                    "charge journal %s line %d (%d bytes) is no whole entry (%s); kept aside in %s%s",
                    path,
                    number,
                    len(raw),
                    exc,
                    path.name,
                    UNREADABLE,
                )
                unreadable.append(raw)
    for request_id, (hold_id, charge) in provisional.items():
        if request_id not in closed:
            by_hold.setdefault(hold_id, {})[request_id] = charge
    return JournalContent({hold: list(charges.values()) for hold, charges in by_hold.items()}, torn, unreadable)


_ENTRY_KEYS = ({"hold", "charge"}, {"hold", "provisional"}, {"released"})


def _entry(raw: bytes, checked: bool) -> dict[str, Any]:
    """One line's entry, checksum verified; ValueError names what is wrong with it."""
    document = json.loads(raw)
    if not isinstance(document, dict):
        raise ValueError("not a JSON object")
    entry, had_checksum = unsealed(document)
    if checked and not had_checksum:
        raise ValueError("no checksum, in a journal written with them")
    if set(entry) not in _ENTRY_KEYS:
        raise ValueError(f"unexpected fields {sorted(entry)}")
    return entry


def _still_at(path: Path, fd: int) -> bool:
    """Whether `path` still names the file open at `fd`."""
    try:
        named = os.stat(path)
    except FileNotFoundError:
        return False
    opened = os.fstat(fd)
    return (named.st_dev, named.st_ino) == (opened.st_dev, opened.st_ino)


async def recover_orphans(directory: Path, send: SendCharges) -> RecoveryReport:
    """Send the charges of every journal whose writer is gone, then delete the journal.

    A journal whose charges cannot be sent (ledger down, unknown hold) is logged and kept
    for the next recovery: money is never dropped, and a replica still starts."""
    journals = charges = torn = kept = unreadable = 0
    if not directory.is_dir():
        return RecoveryReport(0, 0, 0)
    for path in sorted(directory.glob(f"*{SUFFIX}")):
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            continue  # another recoverer finished it
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                continue  # a live writer (or a recoverer working on it)
            if not _still_at(path, fd):
                # Another recoverer finished it, or its live writer compacted it since it was
                # opened here: the lock just taken is the old file's, and `path` is a new,
                # live journal whose reservations are requests still open (read by path, they
                # were charged in full, and the journal unlinked under its writer).
                continue
            with open(fd, "rb", closefd=False) as f:
                content = f.read()  # the file locked, whatever `path` names by now
            journal = read_journal(content, path)
            try:
                for hold_id, hold_charges in journal.by_hold.items():
                    await send(hold_id, hold_charges)
            except Exception:
                log.exception("cannot send the charges journaled in %s; kept for the next recovery", path)
                kept += 1
                continue
            keep_aside(path, journal.unreadable)
            path.unlink()
            journals += 1
            charges += sum(len(c) for c in journal.by_hold.values())
            torn += journal.torn
            unreadable += len(journal.unreadable)
        finally:
            os.close(fd)
    if journals:
        log.info("recovered %d charges from %d journals of dead gateway replicas", charges, journals)
    return RecoveryReport(journals, charges, torn, kept, unreadable)


@dataclass(frozen=True)
class ChargesOnHost:
    """What the ledger charged the requests of a dead gateway replica on this host, for the
    audit spool's recovery of its streams (`switchyard.audit.spool.LedgerView`): a stream's
    stand-in record then states the cost the ledger holds, whichever of the two stores the
    replica reached last before it died."""

    journals: Path  # the host's charge journal directory
    lookup: Callable[[Sequence[str]], Mapping[str, Sequence[Charge]]]  # the ledger's `charges_of`

    def journal_left(self, writer: str) -> bool:
        return journal_left(self.journals, writer)

    def charged(self, request_ids: Sequence[str]) -> Mapping[str, Sequence[Charge]]:
        return self.lookup(request_ids)
