"""The SQLite audit store: an append-only hash chain of entries, their bodies, sealed segments.

One file (`<state>/audit/audit.db`, WAL, `synchronous=FULL`) shared by every writer on the
host; an append takes SQLite's write lock (`BEGIN IMMEDIATE`), reads the chain head and links
the new entries to it, so concurrent writers from several processes still form one chain.
Entries are unique by request id: re-delivering a spooled record never makes a second one.
Chain heads are also anchored outside the database (`anchors.py`), so `verify` can tell a
chain cut at its tail from a short one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from switchyard import sqlite_db
from switchyard.audit.anchors import ANCHORS_FILE, AnchorLog, check_anchors
from switchyard.audit.builder import BodyBlob, PendingEntry
from switchyard.audit.chain import GENESIS, ChainRow, Finding, link_hash, verify_rows
from switchyard.audit.record import AuditEntry, ErasureRecord, RequestRecord, canonical_json, parse_entry
from switchyard.audit.subject_keys import plain_digest
from switchyard.policy.models import BodyStorage

_SCHEMA = """
CREATE TABLE IF NOT EXISTS entries (
    seq        INTEGER PRIMARY KEY AUTOINCREMENT,
    request_id TEXT NOT NULL UNIQUE,
    kind       TEXT NOT NULL,
    team       TEXT,
    flow       TEXT,
    time       REAL NOT NULL,
    payload    TEXT NOT NULL,
    prev_hash  TEXT NOT NULL,
    hash       TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS entries_team_time ON entries (team, time);
CREATE TABLE IF NOT EXISTS bodies (
    request_id TEXT NOT NULL,
    part       TEXT NOT NULL,
    data       BLOB NOT NULL,
    expires_at REAL NOT NULL,
    PRIMARY KEY (request_id, part)
);
CREATE INDEX IF NOT EXISTS bodies_expiry ON bodies (expires_at);
CREATE TABLE IF NOT EXISTS segments (
    segment_no  INTEGER PRIMARY KEY,
    first_seq   INTEGER NOT NULL,
    last_seq    INTEGER NOT NULL,
    last_hash   TEXT NOT NULL,
    sealed_at   REAL NOT NULL,
    exported_to TEXT
);
"""


@dataclass(frozen=True)
class Segment:
    segment_no: int
    first_seq: int
    last_seq: int
    last_hash: str
    sealed_at: float
    exported_to: str | None


@dataclass(frozen=True)
class StoredEntry:
    seq: int
    entry: AuditEntry
    hash: str


class AuditStore:
    def __init__(self, path: Path, anchor_every_s: float = 1.0) -> None:
        """`anchor_every_s`: the longest a committed entry waits to be anchored (one line of
        `anchors.jsonl`, next to the database, per interval at most)."""
        self.path = path
        self.anchors = AnchorLog(path.with_name(ANCHORS_FILE), anchor_every_s)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        # One connection per store, used from worker threads one at a time.
        self._lock = threading.Lock()
        self._db = sqlite_db.connect(path, autocommit=True)  # WAL, synchronous=FULL
        self._db.executescript(_SCHEMA)
        path.chmod(0o600)

    @classmethod
    def in_state_dir(cls, state: Path) -> AuditStore:
        return cls(state / "audit" / "audit.db")

    def close(self) -> None:
        self.anchors.flush()
        with self._lock:
            self._db.close()

    # ------------------------------------------------------------ writing

    def append(self, items: Sequence[PendingEntry | AuditEntry]) -> int:
        """Append entries in one transaction; returns how many were new (others were duplicates)."""
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")  # outside the try: no transaction to roll back if it fails
            try:
                row = db.execute("SELECT hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
                prev = row[0] if row else GENESIS
                added, seq = 0, 0
                for item in items:
                    entry, bodies = (item.record, item.bodies) if isinstance(item, PendingEntry) else (item, ())
                    if db.execute("SELECT 1 FROM entries WHERE request_id = ?", (entry.request_id,)).fetchone():
                        continue
                    seq, prev = self._insert(db, entry, bodies, prev)
                    added += 1
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        if added:
            self.anchors.head(seq, prev)  # after the commit: an anchor never names a lost entry
        return added

    @staticmethod
    def _insert(db: sqlite3.Connection, entry: AuditEntry, bodies: Sequence[BodyBlob], prev: str) -> tuple[int, str]:
        payload = canonical_json(entry)
        digest = link_hash(prev, payload)
        team = entry.team
        flow = entry.flow
        cur = db.execute(
            "INSERT INTO entries (request_id, kind, team, flow, time, payload, prev_hash, hash)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (entry.request_id, entry.kind, team, flow, entry.time, payload, prev, digest),
        )
        expires = entry.body_expires_at if isinstance(entry, RequestRecord) else float("inf")
        for body in bodies:
            db.execute(
                "INSERT INTO bodies VALUES (?, ?, ?, ?)",
                (entry.request_id, body.part, body.data, expires),
            )
        assert cur.lastrowid is not None  # an INSERT into a rowid table always sets it
        return cur.lastrowid, digest

    # ------------------------------------------------------------ reading

    def rows(self) -> Iterator[ChainRow]:
        with self._lock:
            found = self._db.execute("SELECT seq, payload, prev_hash, hash FROM entries ORDER BY seq").fetchall()
        for r in found:
            yield ChainRow(r[0], r[1], r[2], r[3])

    def head(self) -> tuple[int, str]:
        with self._lock:
            row = self._db.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))

    def count(self) -> int:
        with self._lock:
            return int(self._db.execute("SELECT COUNT(*) FROM entries").fetchone()[0])

    def find(
        self,
        team: str | None = None,
        flow: str | None = None,
        since: float | None = None,
        limit: int = 1000,
    ) -> list[StoredEntry]:
        sql = "SELECT seq, payload, hash FROM entries WHERE 1=1"
        args: list[str | float] = []
        for column, value in (("team", team), ("flow", flow)):
            if value is not None:
                sql += f" AND {column} = ?"
                args.append(value)
        if since is not None:
            sql += " AND time >= ?"
            args.append(since)
        sql += " ORDER BY seq LIMIT ?"
        with self._lock:
            found = self._db.execute(sql, (*args, limit)).fetchall()
        return [StoredEntry(r[0], parse_entry(r[1]), r[2]) for r in found]

    def body(self, request_id: str, part: str) -> bytes | None:
        with self._lock:
            row = self._db.execute(
                "SELECT data FROM bodies WHERE request_id = ? AND part = ?", (request_id, part)
            ).fetchone()
        return None if row is None else bytes(row[0])

    # ------------------------------------------------------------ retention

    def remove_plaintext_bodies(self, team: str, subject: str) -> tuple[str, ...]:
        """Erasure of a subject whose schema-1 records named it in clear (`<team>/<user>`)
        and kept unencrypted bodies: delete those bodies. Returns their request ids (the
        erasure record lists them, so verify knows why they are gone). Records written since
        schema 2 carry a pseudonym and sealed bodies only: nothing of theirs matches."""
        removed = []
        for stored in self.find(team=team, limit=2**62):
            entry = stored.entry
            if isinstance(entry, RequestRecord) and entry.subject == subject and _has_plaintext(entry):
                removed.append(entry.request_id)
        with self._lock:
            self._db.executemany("DELETE FROM bodies WHERE request_id = ?", [(rid,) for rid in removed])
        return tuple(removed)

    def purge_expired_bodies(self, now: float | None = None) -> int:
        """Delete bodies past their class's retention; records (and the chain) stay."""
        with self._lock:
            cur = self._db.execute("DELETE FROM bodies WHERE expires_at <= ?", (time.time() if now is None else now,))
        return cur.rowcount

    # ------------------------------------------------------------ segments

    def seal_segments(self, size: int, include_partial: bool = False) -> list[Segment]:
        """Seal consecutive runs of `size` unsealed entries (and the remainder if asked)."""
        sealed = []
        with self._lock:
            db = self._db
            db.execute("BEGIN IMMEDIATE")  # outside the try: no transaction to roll back if it fails
            try:
                row = db.execute("SELECT MAX(segment_no), MAX(last_seq) FROM segments").fetchone()
                number, last = (row[0] or 0), (row[1] or 0)
                head = db.execute("SELECT COALESCE(MAX(seq), 0) FROM entries").fetchone()[0]
                while head - last >= size or (include_partial and head > last):
                    end = min(last + size, head)
                    digest = db.execute("SELECT hash FROM entries WHERE seq = ?", (end,)).fetchone()[0]
                    number += 1
                    seg = Segment(number, last + 1, end, digest, time.time(), None)
                    db.execute(
                        "INSERT INTO segments VALUES (?, ?, ?, ?, ?, NULL)",
                        (seg.segment_no, seg.first_seq, seg.last_seq, seg.last_hash, seg.sealed_at),
                    )
                    sealed.append(seg)
                    last = end
                db.execute("COMMIT")
            except BaseException:
                db.execute("ROLLBACK")
                raise
        for seg in sealed:
            self.anchors.segment(seg.last_seq, seg.last_hash, seg.segment_no)
        return sealed

    def segments(self, unexported_only: bool = False) -> list[Segment]:
        sql = "SELECT * FROM segments" + (" WHERE exported_to IS NULL" if unexported_only else "")
        with self._lock:
            found = self._db.execute(sql + " ORDER BY segment_no").fetchall()
        return [Segment(*r) for r in found]

    def segment_rows(self, seg: Segment) -> list[ChainRow]:
        with self._lock:
            found = self._db.execute(
                "SELECT seq, payload, prev_hash, hash FROM entries WHERE seq BETWEEN ? AND ? ORDER BY seq",
                (seg.first_seq, seg.last_seq),
            ).fetchall()
        return [ChainRow(*r) for r in found]

    def mark_exported(self, segment_no: int, location: str) -> None:
        with self._lock:
            self._db.execute("UPDATE segments SET exported_to = ? WHERE segment_no = ?", (location, segment_no))

    # ------------------------------------------------------------ verification

    def verify(self, now: float | None = None) -> list[Finding]:
        """Chain links, body digests, the sealed segments' recorded heads, and the heads
        anchored in `anchors.jsonl` (the S3 copies: `export.verify_export`)."""
        rows = list(self.rows())
        findings = verify_rows(rows)
        by_seq = {r.seq: r for r in rows}
        segments = self.segments()
        findings.extend(self._verify_anchors(by_seq, segments))
        for seg in segments:
            row = by_seq.get(seg.last_seq)
            if row is None or row.hash != seg.last_hash:
                findings.append(
                    Finding(
                        seg.last_seq,
                        "truncated" if row is None else "edited",
                        f"sealed segment {seg.segment_no} ends with another entry than was sealed",
                    )
                )
        findings.extend(self._verify_bodies(rows, time.time() if now is None else now))
        return distinct(findings)

    def _verify_anchors(self, by_seq: dict[int, ChainRow], segments: list[Segment]) -> list[Finding]:
        anchors, unreadable = self.anchors.read()
        where = f"in {self.anchors.path.name}"
        findings = [
            Finding(0, "anchor_mismatch", f"line {n} of {self.anchors.path} is not an anchor") for n in unreadable
        ]
        if by_seq and not anchors:
            findings.append(
                Finding(
                    max(by_seq),
                    "anchor_mismatch",
                    f"{self.anchors.path} anchors nothing although the chain has entries: it was deleted,"
                    " or nothing was appended since anchoring began",
                )
            )
        by_no = {seg.segment_no: (seg.last_seq, seg.last_hash) for seg in segments}
        return findings + check_anchors(anchors, by_seq, by_no, where)

    def _verify_bodies(self, rows: list[ChainRow], now: float) -> list[Finding]:
        findings = []
        with self._lock:
            stored = {
                (r[0], r[1]): bytes(r[2])
                for r in self._db.execute("SELECT request_id, part, data FROM bodies").fetchall()
            }
        entries = [(row, parse_entry(row.payload)) for row in rows]
        erased = {rid for _, e in entries if isinstance(e, ErasureRecord) for rid in e.bodies_removed}
        for row, entry in entries:
            if not isinstance(entry, RequestRecord) or entry.request_id in erased:
                continue
            for part, body in (("input", entry.input), ("output", entry.output)):
                if body.storage not in (BodyStorage.FULL, BodyStorage.REDACTED):
                    continue
                data = stored.get((entry.request_id, part))
                if data is None and entry.body_expires_at > now:
                    findings.append(
                        Finding(
                            row.seq,
                            "body_edited",
                            f"the {part} body was deleted before its retention ended",
                        )
                    )
                elif data is not None and plain_digest(data) != body.digest:
                    findings.append(Finding(row.seq, "body_edited", f"the {part} body does not match its digest"))
        return findings


def _has_plaintext(record: RequestRecord) -> bool:
    return any(
        b.storage in (BodyStorage.FULL, BodyStorage.REDACTED) and not b.encrypted for b in (record.input, record.output)
    )


def distinct(findings: list[Finding]) -> list[Finding]:
    """In seq order, one finding per (seq, problem): several checks may see the same cut."""
    seen: set[tuple[int, str]] = set()
    kept = []
    for f in sorted(findings, key=lambda f: f.seq):
        if (f.seq, f.problem) not in seen:
            seen.add((f.seq, f.problem))
            kept.append(f)
    return kept
