"""Chain heads kept outside the database: `<state>/audit/anchors.jsonl`, append-only.

A chain cut at its tail is still a valid chain: only a head recorded somewhere else shows
what was there. The store appends a line after its commits (at most one per `every_s`; a
timer writes the newest head when that time is up, so every committed entry is anchored
within `every_s`) and one for every segment it seals. `check_anchors` compares a chain with
anchors, these or the head objects of the S3 export (`audit/export.py`).

Each line is one `write(2)` on an O_APPEND descriptor, under an exclusive `flock` (writers in
several processes never interleave), not fsynced: the database is fsynced first, so a line
lost to a power cut never names an entry the database lacks. A short write (a full disk) is
cut from the file under that lock: its fragment, extended by the next anchor into one line
that is no anchor, would make `verify` report the file as edited for good.

On the host this raises the bar (whoever deletes entries must also edit this file to
match); the object-locked S3 copies are the anchors nobody on the host can alter.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal

from switchyard.audit.chain import ChainRow, Finding

log = logging.getLogger(__name__)

ANCHORS_FILE = "anchors.jsonl"


@dataclass(frozen=True)
class Anchor:
    seq: int
    hash: str
    time: float  # unix seconds it was written
    segment: int | None = None  # the sealed segment that ends at `seq`, if this anchors one

    def line(self) -> str:
        fields: dict[str, object] = {"seq": self.seq, "hash": self.hash, "time": self.time}
        if self.segment is not None:
            fields["segment"] = self.segment
        return json.dumps(fields, sort_keys=True, separators=(",", ":")) + "\n"

    @classmethod
    def parse(cls, line: str) -> Anchor:
        """Raises ValueError (or KeyError/TypeError) on a line that is not an anchor."""
        d = json.loads(line)
        segment = d.get("segment")
        return cls(int(d["seq"]), str(d["hash"]), float(d["time"]), None if segment is None else int(segment))


class AnchorLog:
    """The anchor file of one store; `head` is called after each commit, `segment` per seal."""

    def __init__(self, path: Path, every_s: float = 1.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.every_s = every_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last_written = float("-inf")
        self._pending: tuple[int, str] | None = None
        self._timer: threading.Timer | None = None

    def head(self, seq: int, digest: str) -> None:
        """A commit made entry `seq` (hash `digest`) the chain head."""
        with self._lock:
            if self._pending is None or seq > self._pending[0]:
                self._pending = (seq, digest)
            wait = self._last_written + self.every_s - self._clock()
            if wait <= 0:
                self._write_pending()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._on_timer)
                self._timer.daemon = True
                self._timer.start()

    def segment(self, seq: int, digest: str, segment_no: int) -> None:
        with self._lock:
            self._append(Anchor(seq, digest, time.time(), segment_no))

    def flush(self) -> None:
        """Write the newest head now (a store's close)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._write_pending()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            self._write_pending()

    def _write_pending(self) -> None:
        if self._pending is not None:
            self._append(Anchor(*self._pending, time.time()))
            self._pending = None
            self._last_written = self._clock()

    def _append(self, anchor: Anchor) -> None:
        try:
            line = anchor.line().encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # released by the close
                size = os.fstat(fd).st_size
                written = os.write(fd, line)
                if written != len(line):
                    os.ftruncate(fd, size)
                    raise OSError(errno.ENOSPC, f"a short write ({written} of {len(line)} bytes), cut from the file")
            finally:
                os.close(fd)
        except OSError as exc:
            # The entry is committed; failing its request now would not undo that. A missing
            # anchor only narrows what verify can prove, so it is logged, loudly, not raised.
            log.error("could not anchor audit entry %d in %s: %s", anchor.seq, self.path, exc)

    def read(self) -> tuple[list[Anchor], list[int]]:
        """The anchors, and the line numbers of lines that are not anchors."""
        if not self.path.exists():
            return [], []
        anchors, unreadable = [], []
        for number, line in enumerate(self.path.read_text(errors="replace").splitlines(), start=1):
            try:
                anchors.append(Anchor.parse(line))
            except (ValueError, KeyError, TypeError):
                unreadable.append(number)
        return anchors, unreadable


Mismatch = Literal["anchor_mismatch", "s3_mismatch"]


def check_anchors(
    anchors: Iterable[Anchor],
    by_seq: Mapping[int, ChainRow],
    segments: Mapping[int, tuple[int, str]],
    where: str,
    mismatch: Mismatch = "anchor_mismatch",
) -> list[Finding]:
    """The chain (`by_seq`) and its segment rows (`segments`: number -> last seq, last hash)
    against heads recorded elsewhere (`where` names the place, for the findings)."""
    anchors = list(anchors)
    findings: list[Finding] = []
    head = max(by_seq, default=0)
    beyond = [a for a in anchors if a.seq > head]
    if beyond:
        last = max(beyond, key=lambda a: a.seq)
        gone = f"entry {last.seq} is" if last.seq == head + 1 else f"entries {head + 1}..{last.seq} are"
        findings.append(Finding(last.seq, "truncated", f"{gone} gone: anchored ({where}, {_when(last)})"))
    differ = sorted((a for a in anchors if a.seq in by_seq and by_seq[a.seq].hash != a.hash), key=lambda a: a.seq)
    if differ:
        more = f"; {len(differ) - 1} later anchors disagree too" if len(differ) > 1 else ""
        findings.append(
            Finding(
                differ[0].seq,
                mismatch,
                f"the entry's hash is not the one anchored ({where}, {_when(differ[0])}): the chain was"
                f" rewritten at or before this entry{more}",
            )
        )
    for a in anchors:
        if a.segment is None:
            continue
        row = segments.get(a.segment)
        if row is None:
            findings.append(
                Finding(a.seq, "segment_deleted", f"segment {a.segment} was sealed ({where}) and its row is gone")
            )
        elif row != (a.seq, a.hash):
            findings.append(Finding(a.seq, mismatch, f"segment {a.segment}'s row is not the one sealed ({where})"))
    return findings


def _when(anchor: Anchor) -> str:
    return datetime.fromtimestamp(anchor.time, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
