"""The audit store: an append-only hash chain of entries, their bodies, sealed segments.

The database is `Store.AUDIT`'s (`switchyard.db.location`): a SQLite file on one host
(`<state>/audit/audit.db`, WAL, `synchronous=FULL`), or the cluster's Postgres. Entries are
unique by request id: re-delivering a spooled record never makes a second one.

**One chain across all writers.** Every gateway replica, on every host, appends to one
sequence, serialised by the database: an append takes the `audit_chain` lock (a Postgres
advisory transaction lock; SQLite's write transaction is already exclusive), reads the head
and gives its entries `seq = head + 1, head + 2, ...` itself. Never an AUTOINCREMENT or an
identity column: Postgres spends identity values on rolled-back transactions, and a gap
would read as a deleted entry. So `verify` walks one total order, unchanged, at the cost of
appends waiting for each other: one short transaction holds the lock per append, and a spool
drain appends its records in batches. Sealing segments takes the same lock.

**Anchors.** Chain heads are also written outside the database, to a per-host file
(`<state>/audit/anchors.jsonl`, `anchors.py`), so `verify` can tell a chain cut at its tail
from a short one. On SQLite the file sits beside the database and sees every append, so
`verify` requires it (`anchors_required`: a chain with entries and no anchors is a finding).
On Postgres each host anchors what it appended; `verify` checks every anchor in the local
file against the shared chain but cannot require this host to have appended anything. There
the check of the tail across hosts is the sealed segments and their object-locked S3 copies
(`export.py`, `switchyard audit verify --bucket`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from switchyard.audit.anchors import ANCHORS_FILE, AnchorLog, check_anchors
from switchyard.audit.builder import BodyBlob, PendingEntry
from switchyard.audit.chain import GENESIS, ChainRow, Finding, link_hash, verify_rows
from switchyard.audit.record import (
    AuditEntry,
    ErasureRecord,
    RequestRecord,
    UnreadableEntry,
    canonical_json,
    parse_entry,
)
from switchyard.audit.subject_keys import plain_digest
from switchyard.db.engine import Database, Transaction, database_time
from switchyard.db.location import Store, open_store
from switchyard.db.migrations import Migration, Schema, prepare
from switchyard.policy.models import BodyStorage

CHAIN_LOCK = "audit_chain"  # held by every append and seal: one writer of the chain at a time


def _create_entries(tx: Transaction, db: Database) -> None:
    # SQLite files made before the shared database declared AUTOINCREMENT; appends name their
    # seq now, which such a column accepts. Postgres gets a plain key (see the docstring).
    seq = "INTEGER PRIMARY KEY AUTOINCREMENT" if db.dialect == "sqlite" else "BIGINT PRIMARY KEY"
    tx.execute(
        f"""CREATE TABLE IF NOT EXISTS entries (
            seq        {seq},
            request_id TEXT NOT NULL UNIQUE,
            kind       TEXT NOT NULL,
            team       TEXT,
            flow       TEXT,
            time       DOUBLE PRECISION NOT NULL,
            payload    TEXT NOT NULL,
            prev_hash  TEXT NOT NULL,
            hash       TEXT NOT NULL
        )"""
    )


_V1 = (
    _create_entries,
    "CREATE INDEX IF NOT EXISTS entries_team_time ON entries (team, time)",
    """CREATE TABLE IF NOT EXISTS bodies (
        request_id TEXT NOT NULL,
        part       TEXT NOT NULL,
        data       {blob} NOT NULL,
        expires_at DOUBLE PRECISION NOT NULL,
        PRIMARY KEY (request_id, part)
    )""",
    "CREATE INDEX IF NOT EXISTS bodies_expiry ON bodies (expires_at)",
    """CREATE TABLE IF NOT EXISTS segments (
        segment_no  INTEGER PRIMARY KEY,
        first_seq   BIGINT NOT NULL,
        last_seq    BIGINT NOT NULL,
        last_hash   TEXT NOT NULL,
        sealed_at   DOUBLE PRECISION NOT NULL,
        exported_to TEXT
    )""",
)
SCHEMA = Schema("audit", (Migration(1, _V1),))

_SEGMENT_COLUMNS = "segment_no, first_seq, last_seq, last_hash, sealed_at, exported_to"
_COLUMNS = ("request_id", "kind", "team", "flow", "time")  # an entry's fields, copied out for queries


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
    """The chain in `db` (the store owns it: `close` closes it), anchored in `anchors`."""

    def __init__(self, db: Database, anchors: AnchorLog, anchors_required: bool | None = None) -> None:
        """`anchors_required`: whether a chain with entries but no anchors is a finding; by
        default on SQLite (the anchor file sees every append) and not on Postgres (it sees
        this host's)."""
        self.db = db
        self.anchors = anchors
        self.anchors_required = db.dialect == "sqlite" if anchors_required is None else anchors_required
        prepare(db, SCHEMA)

    @classmethod
    def in_state_dir(cls, state: Path, anchor_every_s: float = 1.0) -> AuditStore:
        """`anchor_every_s`: the longest a committed entry waits to be anchored (one line of
        `<state>/audit/anchors.jsonl` per interval at most)."""
        audit = Path(state) / "audit"
        audit.mkdir(parents=True, exist_ok=True, mode=0o700)  # the anchors live here on every backend
        return cls(open_store(Path(state), Store.AUDIT), AnchorLog(audit / ANCHORS_FILE, anchor_every_s))

    def close(self) -> None:
        self.anchors.flush()
        self.db.close()

    # ------------------------------------------------------------ writing

    def append(self, items: Sequence[PendingEntry | AuditEntry]) -> int:
        """Append entries in one transaction; returns how many were new (others were duplicates)."""
        added = 0
        with self.db.transaction() as tx:
            tx.lock(CHAIN_LOCK)
            seq, prev = _head(tx)
            for item in items:
                entry, bodies = (item.record, item.bodies) if isinstance(item, PendingEntry) else (item, ())
                if tx.execute("SELECT 1 FROM entries WHERE request_id = ?", (entry.request_id,)).one():
                    continue
                seq += 1
                prev = _insert(tx, seq, entry, bodies, prev)
                added += 1
        if added:
            self.anchors.head(seq, prev)  # after the commit: an anchor never names a lost entry
        return added

    # ------------------------------------------------------------ reading

    def rows(self) -> Iterator[ChainRow]:
        with self.db.read() as tx:
            found = tx.execute("SELECT seq, payload, prev_hash, hash FROM entries ORDER BY seq").rows
        for r in found:
            yield ChainRow(int(r[0]), r[1], r[2], r[3])

    def head(self) -> tuple[int, str]:
        with self.db.read() as tx:
            return _head(tx)

    def count(self) -> int:
        with self.db.read() as tx:
            row = tx.execute("SELECT COUNT(*) FROM entries").one()
        assert row is not None  # COUNT always answers one row
        return int(row[0])

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
        with self.db.read() as tx:
            found = tx.execute(sql, (*args, limit)).rows
        return [StoredEntry(int(r[0]), _entry(int(r[0]), r[1]), r[2]) for r in found]

    def body(self, request_id: str, part: str) -> bytes | None:
        with self.db.read() as tx:
            row = tx.execute("SELECT data FROM bodies WHERE request_id = ? AND part = ?", (request_id, part)).one()
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
        with self.db.transaction() as tx:
            for rid in removed:
                tx.execute("DELETE FROM bodies WHERE request_id = ?", (rid,))
        return tuple(removed)

    def purge_expired_bodies(self, now: float | None = None) -> int:
        """Delete bodies past their class's retention; records (and the chain) stay. `now`:
        the database's clock unless given. By the clock of the host that purged (a gateway
        replica, a cron job), one running ahead deleted bodies before their retention ended,
        and `verify` on a right clock called that tampering (stop 48)."""
        with self.db.transaction() as tx:
            cutoff = database_time(self.db, tx) if now is None else now
            return tx.execute("DELETE FROM bodies WHERE expires_at <= ?", (cutoff,)).rowcount

    # ------------------------------------------------------------ segments

    def seal_segments(self, size: int, include_partial: bool = False) -> list[Segment]:
        """Seal consecutive runs of `size` unsealed entries (and the remainder if asked)."""
        sealed = []
        with self.db.transaction() as tx:
            tx.lock(CHAIN_LOCK)  # two sealers must not number the same segment
            row = tx.execute("SELECT MAX(segment_no), MAX(last_seq) FROM segments").one()
            number, last = (int(row[0] or 0), int(row[1] or 0)) if row else (0, 0)
            head, _ = _head(tx)
            while head - last >= size or (include_partial and head > last):
                end = min(last + size, head)
                found = tx.execute("SELECT hash FROM entries WHERE seq = ?", (end,)).one()
                assert found is not None  # appends number entries without gaps
                number += 1
                seg = Segment(number, last + 1, end, found[0], time.time(), None)
                tx.execute(
                    f"INSERT INTO segments ({_SEGMENT_COLUMNS}) VALUES (?, ?, ?, ?, ?, NULL)",
                    (seg.segment_no, seg.first_seq, seg.last_seq, seg.last_hash, seg.sealed_at),
                )
                sealed.append(seg)
                last = end
        for seg in sealed:
            self.anchors.segment(seg.last_seq, seg.last_hash, seg.segment_no)
        return sealed

    def segments(self, unexported_only: bool = False) -> list[Segment]:
        sql = f"SELECT {_SEGMENT_COLUMNS} FROM segments" + (" WHERE exported_to IS NULL" if unexported_only else "")
        with self.db.read() as tx:
            found = tx.execute(sql + " ORDER BY segment_no").rows
        return [Segment(int(r[0]), int(r[1]), int(r[2]), r[3], float(r[4]), r[5]) for r in found]

    def segment_rows(self, seg: Segment) -> list[ChainRow]:
        with self.db.read() as tx:
            found = tx.execute(
                "SELECT seq, payload, prev_hash, hash FROM entries WHERE seq BETWEEN ? AND ? ORDER BY seq",
                (seg.first_seq, seg.last_seq),
            ).rows
        return [ChainRow(int(r[0]), r[1], r[2], r[3]) for r in found]

    def mark_exported(self, segment_no: int, location: str) -> None:
        with self.db.transaction() as tx:
            tx.execute("UPDATE segments SET exported_to = ? WHERE segment_no = ?", (location, segment_no))

    # ------------------------------------------------------------ verification

    def verify(self, now: float | None = None) -> list[Finding]:
        """Chain links, body digests, the sealed segments' recorded heads, and the heads
        anchored in `anchors.jsonl` (the S3 copies: `export.verify_export`)."""
        rows = list(self.rows())
        findings = verify_rows(rows)
        by_seq = {r.seq: r for r in rows}
        segments = self.segments()
        findings.extend(self._verify_anchors(by_seq, segments))
        findings.extend(_verify_tiling(segments))
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
        entries, unreadable = self._read_entries(rows)
        findings.extend(unreadable)
        findings.extend(self._verify_bodies(entries, now))
        return distinct(findings)

    def _verify_anchors(self, by_seq: dict[int, ChainRow], segments: list[Segment]) -> list[Finding]:
        anchors, unreadable = self.anchors.read()
        where = f"in {self.anchors.path.name}"
        findings = [
            Finding(0, "anchor_mismatch", f"line {n} of {self.anchors.path} is not an anchor") for n in unreadable
        ]
        if by_seq and not anchors and self.anchors_required:
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

    def _read_entries(self, rows: list[ChainRow]) -> tuple[list[tuple[int, AuditEntry]], list[Finding]]:
        """Every entry of `rows` that reads as one, by seq, and a finding for each that does
        not: a payload that is not an entry, or columns that say other than it does. The
        columns are what queries select by, so an edited `team` hides its record from its
        team's queries."""
        with self.db.read() as tx:
            found = tx.execute(f"SELECT seq, {', '.join(_COLUMNS)} FROM entries").rows
        columns_of = {int(r[0]): r[1:] for r in found}
        entries, findings = [], []
        for row in rows:
            seq = row.seq
            try:
                entry = parse_entry(row.payload)
            except UnreadableEntry as exc:
                findings.append(Finding(seq, "edited", f"the payload is not an audit entry: {exc}"))
                continue
            entries.append((seq, entry))
            for name, column in zip(_COLUMNS, columns_of.get(seq, ()), strict=False):
                if column != getattr(entry, name):
                    findings.append(
                        Finding(
                            seq,
                            "edited",
                            f"its {name} column says {column!r}, its entry {getattr(entry, name)!r}: queries by "
                            f"{name} go by the column",
                        )
                    )
        return entries, findings

    def _verify_bodies(self, entries: list[tuple[int, AuditEntry]], now: float | None) -> list[Finding]:
        findings = []
        with self.db.read() as tx:
            stored = {(r[0], r[1]): bytes(r[2]) for r in tx.execute("SELECT request_id, part, data FROM bodies").rows}
            # After the read, on the clock purges use: a purge this read saw ran at or before it.
            now = database_time(self.db, tx) if now is None else now
        erased = {rid for _, e in entries if isinstance(e, ErasureRecord) for rid in e.bodies_removed}
        for seq, entry in entries:
            if not isinstance(entry, RequestRecord) or entry.request_id in erased:
                continue
            for part, body in (("input", entry.input), ("output", entry.output)):
                if body.storage not in (BodyStorage.FULL, BodyStorage.REDACTED):
                    continue
                data = stored.get((entry.request_id, part))
                if data is None and entry.body_expires_at > now:
                    findings.append(
                        Finding(
                            seq,
                            "body_edited",
                            f"the {part} body was deleted before its retention ended",
                        )
                    )
                elif data is not None and plain_digest(data) != body.digest:
                    findings.append(Finding(seq, "body_edited", f"the {part} body does not match its digest"))
        return findings


def _verify_tiling(segments: list[Segment]) -> list[Finding]:
    """Segments are sealed end to end from entry 1: one that begins elsewhere was edited (the
    anchors and the S3 copies know only where each ends, and an export reads from its first)."""
    findings, begins = [], 1
    for seg in segments:
        if seg.first_seq != begins or seg.last_seq < seg.first_seq:
            findings.append(
                Finding(
                    seg.last_seq,
                    "edited",
                    f"sealed segment {seg.segment_no} covers entries {seg.first_seq}..{seg.last_seq}, not"
                    f" {begins}..{seg.last_seq}: its row was edited (or the one before it deleted)",
                )
            )
        begins = seg.last_seq + 1
    return findings


def _entry(seq: int, payload: str) -> AuditEntry:
    try:
        return parse_entry(payload)
    except UnreadableEntry as exc:
        raise UnreadableEntry(
            f"audit entry {seq} is not an audit entry ({exc}): the database was edited; `switchyard audit verify`"
            " lists what else was"
        ) from None


def _head(tx: Transaction) -> tuple[int, str]:
    row = tx.execute("SELECT seq, hash FROM entries ORDER BY seq DESC LIMIT 1").one()
    return (0, GENESIS) if row is None else (int(row[0]), str(row[1]))


def _insert(tx: Transaction, seq: int, entry: AuditEntry, bodies: Sequence[BodyBlob], prev: str) -> str:
    """Entry `seq`, linked to `prev`; returns its hash."""
    payload = canonical_json(entry)
    digest = link_hash(prev, payload)
    tx.execute(
        "INSERT INTO entries (seq, request_id, kind, team, flow, time, payload, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (seq, entry.request_id, entry.kind, entry.team, entry.flow, entry.time, payload, prev, digest),
    )
    expires = entry.body_expires_at if isinstance(entry, RequestRecord) else float("inf")
    for body in bodies:
        tx.execute(
            "INSERT INTO bodies (request_id, part, data, expires_at) VALUES (?, ?, ?, ?)",
            (entry.request_id, body.part, body.data, expires),
        )
    return digest


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
