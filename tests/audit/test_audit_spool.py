"""The async spool and the sink: durability by risk tier, the loss bound, crash recovery."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from _audit_helpers import make_exchange, make_flow

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.record import RequestRecord, canonical_json
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.spool import (
    AuditSpool,
    decode_line,
    drain_file,
    encode_line,
    pending_lines,
    recover_orphans,
)
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring, b64
from switchyard.budgets.charge_journal import ChargeJournal, ChargesOnHost, journal_dir
from switchyard.budgets.ledger import BudgetLedger, Charge, HoldRequest
from switchyard.budgets.money import usd_to_nanos
from switchyard.budgets.resolve import BudgetLine
from switchyard.cli import main
from switchyard.db.engine import open_database
from switchyard.db.location import Store, open_store
from switchyard.gateway.seams import AuditUnavailable, Bill, Usage
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore
from switchyard.policy.models import DataPolicies, RiskTier, Role
from switchyard.sealed_json import sealed_bytes

HERE = Path(__file__).parent


@pytest.fixture
def builder(tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> RecordBuilder:
    return RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path))


async def test_spooled_records_reach_the_store(tmp_path: Path, builder: RecordBuilder) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    backlog_seen: list[int] = []
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600, on_backlog=backlog_seen.append)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    for _ in range(5):
        await sink.record(make_exchange(), durable=False)
    assert store.count() == 0 and spool.backlog == 5 and backlog_seen[-1] == 5
    report = await spool.drain_once()
    assert (report.lines, report.new_entries) == (5, 5)
    assert store.count() == 5 and spool.backlog == 0 and backlog_seen[-1] == 0
    await spool.stop()
    assert [p.name for p in (tmp_path / "spool").iterdir()] == [".recovery"]  # no spool, no lock


async def test_high_risk_is_durable_even_if_the_caller_says_otherwise(tmp_path: Path, builder: RecordBuilder) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    await sink.record(make_exchange(flow=make_flow(risk=RiskTier.HIGH)), durable=False)
    assert store.count() == 1 and spool.backlog == 0
    await spool.stop()


async def test_store_outage_fails_high_risk_closed(
    tmp_path: Path, builder: RecordBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    sink = StoreAuditSink(builder, store, None)

    def broken(*_: object) -> int:
        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(store, "append", broken)
    with pytest.raises(AuditUnavailable, match="unavailable"):
        await sink.record(make_exchange(flow=make_flow(risk=RiskTier.HIGH)), durable=True)


async def test_a_full_spool_refuses_loudly_and_recovers(
    tmp_path: Path, builder: RecordBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=0.01, max_backlog=3, full_wait_s=0.2)
    real_append = store.append

    def broken(*_: object) -> int:
        raise sqlite3.OperationalError("database is locked")

    monkeypatch.setattr(store, "append", broken)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    for _ in range(3):
        await sink.record(make_exchange(), durable=False)
    with pytest.raises(AuditUnavailable, match="backlog is full"):
        await sink.record(make_exchange(), durable=False)
    monkeypatch.setattr(store, "append", real_append)  # the store comes back
    await sink.record(make_exchange(), durable=False)  # waits for room, then is accepted
    await spool.stop()
    assert store.count() == 4 and store.verify() == []


async def test_recovery_leaves_live_writers_alone(tmp_path: Path, builder: RecordBuilder) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    for _ in range(2):
        await spool.put(builder.build(make_exchange()))
    assert recover_orphans(tmp_path / "spool", store).files == 0 and store.count() == 0
    assert spool._lock_fd is not None
    os.close(spool._lock_fd)  # the writer "dies": its lock is released, its files stay
    spool._lock_fd = None
    report = recover_orphans(tmp_path / "spool", store)
    assert (report.lines, report.new_entries) == (2, 2) and store.count() == 2
    assert not list((tmp_path / "spool").glob("*.lock"))
    if spool._task is not None:
        spool._task.cancel()


def test_a_spool_whose_lock_file_is_gone_is_drained(tmp_path: Path, builder: RecordBuilder) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    directory = tmp_path / "spool"
    directory.mkdir()
    lines = b"".join(encode_line(builder.build(make_exchange())) for _ in range(3))
    (directory / "123-dead.1.spool").write_bytes(lines + b'{"record": {"trunc')  # torn tail
    report = recover_orphans(directory, store)
    assert (report.files, report.lines, report.torn_lines) == (1, 3, 1) and store.count() == 3


def test_killed_writer_loses_nothing_acknowledged(tmp_path: Path) -> None:
    """SIGKILL a writer mid-load; the next starter drains its spool. Every acknowledged record
    is stored exactly once, high-risk ones were already in SQLite, and the chain verifies."""
    state, ack = tmp_path / "state", tmp_path / "acks.txt"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HERE.parents[1] / "platform"), str(HERE)])}
    proc = subprocess.Popen([sys.executable, str(HERE / "_audit_spool_writer.py"), str(state), str(ack)], env=env)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline and (not ack.exists() or ack.read_text().count("\n") < 200):
            assert proc.poll() is None, "writer exited early"
            time.sleep(0.1)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    acked = [line.split() for line in ack.read_text().splitlines() if line.count(" ") == 2]
    assert len(acked) >= 200
    store = AuditStore.in_state_dir(state)
    stored_before = {e.entry.request_id for e in store.find(limit=100_000)}
    high = [rid for rid, tier, _ in acked if tier == "high"]
    assert set(high) <= stored_before  # durable before the "response"
    spool_dir = state / "audit" / "spool"
    at_risk = pending_lines(spool_dir)  # what a host crash (not a process crash) could lose now
    assert at_risk <= 10_000  # the spool's max_backlog
    report = recover_orphans(spool_dir, store)
    assert report.lines == at_risk and report.torn_lines <= 1
    stored = [e.entry.request_id for e in store.find(limit=100_000)]
    assert len(stored) == len(set(stored))  # none twice
    assert {rid for rid, _, _ in acked} <= set(stored)  # none lost
    assert store.verify() == []
    assert list(spool_dir.glob("*.spool")) == []
    print(f"\nkill test: {len(acked)} acknowledged, {at_risk} in the spool at the kill, recovered {report.new_entries}")


def _die(spool: AuditSpool) -> None:
    """What a SIGKILL does to a writer: its fds (and so its lock) go, its files stay."""
    for fd in (spool._fd, spool._streams_fd, spool._lock_fd):
        if fd is not None:
            os.close(fd)
    spool._fd = spool._streams_fd = spool._lock_fd = None


async def test_a_dead_writers_open_streams_get_their_stand_ins_and_no_more(
    tmp_path: Path, builder: RecordBuilder
) -> None:
    """Three streams open on a writer that dies: one whose real record was spooled, one whose
    real record was stored durably, one still running. Recovery stores each real record, the
    running one's stand-in, and nothing twice; compaction drops superseded stand-ins."""
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    high = make_flow(risk=RiskTier.HIGH)
    spooled, running = make_exchange(request_id="req-spooled"), make_exchange(request_id="req-running")
    durable = make_exchange(flow=high, request_id="req-durable")
    for ex in (spooled, durable, running):
        await sink.open_stream(dataclasses.replace(ex, status_code=502, error_code="replica_lost"), durable=False)
    assert spool.open_streams == 3
    await sink.record(spooled, durable=False)
    await sink.record(durable, durable=False)  # high risk: stored at once
    assert spool.open_streams == 1 and store.count() == 1
    spool.compact_streams()
    stand_ins = (tmp_path / "spool" / f"{spool.writer_id}.open").read_bytes().splitlines()
    assert len(stand_ins) == 1 and b"req-running" in stand_ins[0]
    extra = make_exchange(request_id="req-late")
    await sink.open_stream(dataclasses.replace(extra, status_code=502, error_code="replica_lost"), durable=False)
    await sink.record(extra, durable=False)  # superseded, but the file still holds its stand-in
    _die(spool)

    report = recover_orphans(tmp_path / "spool", AuditStore.in_state_dir(tmp_path))
    assert report.torn_lines == 0
    records = {e.entry.request_id: e.entry for e in store.find(limit=100)}
    assert set(records) == {"req-spooled", "req-durable", "req-running", "req-late"}
    assert [records[r].status_code for r in ("req-spooled", "req-durable", "req-late")] == [200, 200, 200]
    assert (records["req-running"].status_code, records["req-running"].error_code) == (502, "replica_lost")
    assert store.verify() == []
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == [".recovery"]


async def test_streams_open_at_a_graceful_stop_are_recorded(tmp_path: Path, builder: RecordBuilder) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    ex = make_exchange(request_id="req-open")
    await sink.open_stream(dataclasses.replace(ex, status_code=502, error_code="replica_lost"), durable=True)
    await spool.stop()
    (entry,) = [e.entry for e in store.find(limit=10)]
    assert entry.request_id == "req-open" and entry.error_code == "replica_lost"


async def test_a_restated_stand_in_wins_over_the_first(tmp_path: Path, builder: RecordBuilder) -> None:
    """Found in CI: a stream charged, then its replica killed before its record, left the
    first stand-in (its whole reservation) against a ledger holding the real charge. The
    stand-in restated after the charge is the one recovery stores."""
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    ex = make_exchange(request_id="req-charged")
    await sink.open_stream(dataclasses.replace(ex, status_code=502, error_code="replica_lost", cost_usd=5.0), False)
    await sink.open_stream(dataclasses.replace(ex, status_code=502, error_code="replica_lost", cost_usd=0.25), False)
    _die(spool)
    recover_orphans(tmp_path / "spool", AuditStore.in_state_dir(tmp_path))
    (entry,) = [e.entry for e in store.find(limit=10)]
    assert entry.request_id == "req-charged" and entry.cost_usd == 0.25


async def test_a_dead_writers_stand_ins_wait_for_its_charge_journal_then_state_the_ledgers_charges(
    tmp_path: Path, builder: RecordBuilder
) -> None:
    """Found in CI: a stream's replica died after its charge was journaled and before its
    stand-in was restated, so the stand-in (its whole reservation) disagreed with the ledger
    (its real charge). A writer named after its charge journal: while that journal is on the
    host its stand-ins wait (the ledger may not have its charges yet); then each is stored with
    the ledger's charges of its request as its bills and cost, whatever it was written with. A
    request the ledger never charged is recorded at none; a ledger that cannot answer keeps
    them for the next recovery."""
    ledger = BudgetLedger(open_database(f"sqlite:///{tmp_path / 'ledger.db'}"))
    line = BudgetLine("team:support:day:2026-12-05", 10**12, "2026-12-06T00:00:00+00:00")
    ledger.hold(HoldRequest("lease", "w", (line,), 10**9, 10**9, 60))
    ledger.settle(
        "lease",
        [
            Charge("req-charged", "support", "reply", "gpt-4o-mini", None, "2026-12-05", 5_850, 30, 12),
            Charge("req-charged.2", "support", "reply", "claude-haiku", None, "2026-12-05", 150, 3, 0, 1),
        ],
        close=False,
    )
    journals = tmp_path / "journal"
    journals.mkdir()
    (journals / "host_7_abc.charges").write_bytes(b"")  # the dead writer's journal, not yet recovered
    answering = ChargesOnHost(journals, ledger.charges_of)
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600, writer_id="host_7_abc", ledger=answering)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    for rid in ("req-charged", "req-uncharged"):  # written at their reservations
        lost = make_exchange(request_id=rid, status_code=502, error_code="replica_lost", cost_usd=5.7769)
        await sink.open_stream(lost, durable=False)
    _die(spool)

    assert recover_orphans(tmp_path / "spool", store, answering).kept == 1 and store.count() == 0

    def ledger_down(request_ids: Sequence[str]) -> Mapping[str, Sequence[Charge]]:
        raise ConnectionError("ledger unreachable")

    (journals / "host_7_abc.charges").unlink()  # its charges reached the ledger
    assert recover_orphans(tmp_path / "spool", store, ChargesOnHost(journals, ledger_down)).kept == 1
    assert store.count() == 0

    report = recover_orphans(tmp_path / "spool", store, answering)
    assert (report.kept, report.new_entries) == (0, 2)
    records = {e.entry.request_id: e.entry for e in store.find(limit=10)}
    charged, uncharged = records["req-charged"], records["req-uncharged"]
    assert isinstance(charged, RequestRecord) and isinstance(uncharged, RequestRecord)
    assert usd_to_nanos(charged.cost_usd) == 6_000 and charged.error_code == "replica_lost"
    assert [(b.model, b.prompt_tokens, b.completion_tokens, b.cached_prompt_tokens) for b in charged.bills] == [
        ("gpt-4o-mini", 30, 12, 0),
        ("claude-haiku", 3, 0, 1),
    ]
    assert [usd_to_nanos(b.cost_usd) for b in charged.bills] == [5_850, 150]
    assert [b.basis for b in charged.bills] == [None, None]  # the ledger keeps no basis; none is claimed
    assert (uncharged.cost_usd, uncharged.bills) == (0.0, ())
    assert store.verify() == []
    assert sorted(p.name for p in (tmp_path / "spool").iterdir()) == [".recovery"]


async def test_a_recovered_stand_in_charged_what_it_states_keeps_what_its_bills_were_charged_at(
    tmp_path: Path, builder: RecordBuilder
) -> None:
    """A stand-in states its whole reservation, held: when the ledger charged exactly that (the
    replica died before its stream settled), its record says the bill was the hold."""
    ledger = BudgetLedger(open_database(f"sqlite:///{tmp_path / 'ledger.db'}"))
    line = BudgetLine("team:support:day:2026-12-05", 10**12, "2026-12-06T00:00:00+00:00")
    ledger.hold(HoldRequest("lease", "w", (line,), 10**9, 10**9, 60))
    held = 5_776_900
    ledger.settle(
        "lease", [Charge("req-held", "support", "reply", "gpt-4o-mini", None, "2026-12-05", held, 0, 0)], close=False
    )
    (tmp_path / "journal").mkdir()  # its charge journal already reached the ledger
    answering = ChargesOnHost(tmp_path / "journal", ledger.charges_of)
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600, writer_id="host_8_def", ledger=answering)
    await spool.start()
    stand_in = make_exchange(
        request_id="req-held",
        status_code=502,
        error_code="replica_lost",
        cost_usd=held / 1e9,
        bills=(Bill("gpt-4o-mini", Usage(0, 0), held, "held"),),
    )
    await StoreAuditSink(builder, store, spool).open_stream(stand_in, durable=False)
    _die(spool)

    assert recover_orphans(tmp_path / "spool", store, answering).new_entries == 1
    (entry,) = [e.entry for e in store.find(limit=10)]
    assert isinstance(entry, RequestRecord)
    assert [(b.basis, usd_to_nanos(b.cost_usd)) for b in entry.bills] == [("held", held)]
    assert store.verify() == []
    ledger.db.close()


async def test_switchyard_audit_drain_records_a_dead_replicas_cut_off_stream_at_its_charge(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's command on a host whose replica died after a stream's charge was
    journaled and before its stand-in was restated: it sends the journal first, then stores
    the stand-in at the ledger's charge (it drained the spool first before, at the reservation)."""
    state = audit_state
    with closing(open_store(state, Store.LEDGER)) as db:  # where the command will look for it
        ledger = BudgetLedger(db)
        line = BudgetLine("team:support:day:2026-12-05", 10**12, "2026-12-06T00:00:00+00:00")
        ledger.hold(HoldRequest("lease", "dead", (line,), 10**9, 10**9, 60))
        journal = ChargeJournal(journal_dir(state), "dead")
        charge = Charge("req-cut", "support", "reply", "gpt-4o-mini", None, "2026-12-05", 5_850, 30, 12)
        journal.reserve("lease", dataclasses.replace(charge, nanos=5_776_900, prompt_tokens=0, completion_tokens=0))
        journal.append("lease", charge)  # charged; the replica dies before the restatement
        assert journal._fd is not None
        os.close(journal._fd)  # its death: the lock goes, the file stays
        store = AuditStore.in_state_dir(state)
        builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(state))
        spool = AuditSpool(state / "audit" / "spool", store, drain_interval_s=3600, writer_id=journal.name)
        await spool.start()
        lost = make_exchange(request_id="req-cut", status_code=502, error_code="replica_lost", cost_usd=0.0057769)
        await StoreAuditSink(builder, store, spool).open_stream(lost, durable=False)
        _die(spool)
        with KeyStore.in_state_dir(state) as keys:
            key = keys.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)[0]
        drain = ["audit", "drain", "--json", "--state-dir", str(state), "--api-key", key]
        code = await asyncio.to_thread(main, drain)
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and (out["charge_journals"], out["new"], out["stand_ins_kept"]) == (1, 1, 0)
        (entry,) = [e.entry for e in store.find(limit=10)]
        assert isinstance(entry, RequestRecord) and entry.error_code == "replica_lost"
        assert usd_to_nanos(entry.cost_usd) == 5_850 == ledger.charged_nanos()
        store.close()


def test_a_spool_line_is_the_same_bytes_as_before_the_record_was_embedded_verbatim(builder: RecordBuilder) -> None:
    """Lines written before and after the encoding change drain alike (a spool may hold both):
    a line is the old encoding's bytes with the checksum field added (stop 44), and a line of
    the old encoding, without one, still decodes."""
    pending = builder.build(make_exchange(output="ünïcode € answer"))
    old = {
        "record": json.loads(canonical_json(pending.record)),
        "bodies": [{"part": b.part, "data": b64(b.data)} for b in pending.bodies],
    }
    old_line = json.dumps(old, separators=(",", ":")).encode()
    assert encode_line(pending) == sealed_bytes(old_line) + b"\n"
    assert decode_line(old_line) == decode_line(encode_line(pending)) == pending


async def test_a_short_write_never_swallows_the_next_record(
    tmp_path: Path, builder: RecordBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found reading the spool (stop 43): a short write (a full disk) refused its record but
    left its fragment as the file's last bytes, and the next record, acknowledged, was appended
    to it: one line that decoded as nothing, dropped at the drain as "torn"."""
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    real_write, cut = os.write, [True]

    def full_disk(fd: int, data: bytes) -> int:
        if cut and data.startswith(b'{"record"'):
            cut.clear()
            return real_write(fd, data[: len(data) // 2])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    refused, kept = builder.build(make_exchange()), builder.build(make_exchange())
    with pytest.raises(AuditUnavailable, match="short write"):
        await spool.put(refused)
    await spool.put(kept)
    await spool.stop()
    stored = [e.entry.request_id for e in store.find(limit=10)]
    assert stored == [kept.record.request_id], stored


def test_a_line_that_is_no_record_is_kept_aside_and_the_rest_drained(tmp_path: Path, builder: RecordBuilder) -> None:
    """Found by reading the drain (stop 43): a complete line that was no record (something
    changed the file: a crash tears only the last line) was dropped with the file as "torn",
    and a line of JSON of another shape (a list) raised out of every drain, so the writer's
    other records never reached the store. Now the others are stored and such lines are kept,
    as they were, in `<file>.unreadable`."""
    store = AuditStore.in_state_dir(tmp_path)
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    records = [builder.build(make_exchange()) for _ in range(3)]
    junk = [b"[1, 2]", b'{"record": {"kind": "request"}, "bodies": []}']
    lines = [encode_line(records[0]), junk[0] + b"\n", encode_line(records[1]), junk[1] + b"\n"]
    path = spool_dir / "w.1.spool"
    path.write_bytes(b"".join([*lines, encode_line(records[2])[:40]]))  # and a torn last line
    report = drain_file(path, store)
    assert (report.lines, report.new_entries, report.torn_lines, report.unreadable) == (2, 2, 1, 2)
    assert {e.entry.request_id for e in store.find(limit=10)} == {r.record.request_id for r in records[:2]}
    assert not path.exists()
    assert (spool_dir / "w.1.spool.unreadable").read_bytes() == b"".join(j + b"\n" for j in junk)
