"""The leased gate's charge journal: what a killed replica settled but never sent reaches the
ledger through the next gate on the host, once, and a live replica's journal is left alone."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable, Sequence
from contextlib import closing
from pathlib import Path

import pytest
from _budget_helpers import shipped, wall_clock_ctx

from switchyard.budgets.admission import Admissions
from switchyard.budgets.charge_journal import ChargeJournal, read_journal, recover_orphans
from switchyard.budgets.leased_gate import LeaseConfig, LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger, Charge, SoftAlert
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.cli import main
from switchyard.db.location import Store, open_store
from switchyard.gateway.host_recovery import HostRecovery
from switchyard.gateway.seams import Bill, Reservation, Usage
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore
from switchyard.policy.models import Role

NEVER_FLUSH = LeaseConfig(flush_every_s=3600, flush_batch=10_000)  # charges stay local until close


def _gate(tmp: Path, holder: str, ledger: BudgetLedger) -> LeasedBudgetGate:
    ps = shipped()
    return LeasedBudgetGate(
        Admissions(lambda: ps),
        InProcessLedgerClient(LedgerService(ledger)),
        holder,
        NEVER_FLUSH,
        journal=ChargeJournal(tmp / "journal", holder),
    )


async def _spend(gate: LeasedBudgetGate, n: int) -> list[str]:
    ps = shipped()
    ids = []
    for _ in range(n):
        ctx = wall_clock_ctx(ps)
        estimate = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "hi"}], 16)
        reservation = await gate.reserve(ctx, estimate)
        await gate.settle(reservation, [Bill("gpt-4o-mini", Usage(10, 5), 123_000)])
        ids.append(ctx.request_id)
    return ids


def _die(journal: ChargeJournal | None) -> ChargeJournal:
    """What a process death does to its journal: the fd (and so the flock) goes, the file stays."""
    assert journal is not None and journal._fd is not None
    os.close(journal._fd)
    journal._fd = None
    return journal


async def test_a_dead_replicas_journaled_charges_reach_the_ledger_once(tmp_path: Path, ledger: BudgetLedger) -> None:
    dead = _gate(tmp_path, "dead", ledger)
    ids = await _spend(dead, 5)
    assert ledger.charged_nanos() < 5 * 123_000, "the test needs charges that never left the replica"
    journal = _die(dead.journal)

    survivor = _gate(tmp_path, "survivor", ledger)
    report = await survivor.recover()
    assert (report.journals, report.charges, report.torn_lines, report.kept) == (1, 5, 0, 0)
    assert ledger.charged_nanos() == 5 * 123_000
    assert not journal.path.exists()
    again = await survivor.recover()  # nothing left, and nothing counted twice
    assert again.charges == 0 and ledger.charged_nanos() == 5 * 123_000
    assert len(ids) == 5


async def test_a_live_replicas_journal_is_left_alone(tmp_path: Path, ledger: BudgetLedger) -> None:
    live = _gate(tmp_path, "live", ledger)
    await _spend(live, 3)
    sent_before = ledger.charged_nanos()
    report = await _gate(tmp_path, "other", ledger).recover()
    assert report.journals == 0 and ledger.charged_nanos() == sent_before < 3 * 123_000
    await live.aclose()  # the live replica sends its own charges and removes its journal
    assert ledger.charged_nanos() == 3 * 123_000
    assert live.journal is not None and not live.journal.path.exists()


async def test_the_journal_is_emptied_once_its_charges_are_in_the_ledger(tmp_path: Path, ledger: BudgetLedger) -> None:
    gate = _gate(tmp_path, "replica", ledger)
    await _spend(gate, 4)
    assert gate.journal is not None
    lines = [json.loads(line) for line in gate.journal.path.read_bytes().splitlines()]
    assert [next(k for k in line if k != "hold") for line in lines] == ["provisional", "charge"] * 4
    for lease in list(gate._leases.values()):
        await gate._flush(lease, close=False)
    await gate.maintain()
    assert gate.journal.path.read_bytes() == b""
    assert ledger.charged_nanos() == 4 * 123_000


def test_a_journal_written_by_a_killed_process_is_recovered(tmp_path: Path, ledger: BudgetLedger) -> None:
    """A real SIGKILL: a child process journals two charges (one line torn) and dies."""
    ps = shipped()
    gate = _gate(tmp_path, "probe", ledger)
    # A hold in the ledger for the child's charges to land on.
    ctx = wall_clock_ctx(ps)

    async def hold() -> str:
        est = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "x"}], 16)
        await gate.reserve(ctx, est)
        return next(iter(gate._leases.values())).hold_id

    hold_id = asyncio.run(hold())
    charge = Charge("child-1", "support", "reply", "gpt-4o-mini", None, "2026-11-30", 7_000, 1, 1)
    child = f"""
import dataclasses, os, signal, sys
from pathlib import Path
from switchyard.budgets.charge_journal import ChargeJournal
from switchyard.budgets.ledger import Charge
j = ChargeJournal(Path({str(tmp_path / "journal")!r}), "child")
c = Charge(**{dataclasses.asdict(charge)!r})
j.append({hold_id!r}, c)
j.append({hold_id!r}, dataclasses.replace(c, charge_id="child-2"))
os.write(j._fd, b'{{"hold": "{hold_id}", "charge": {{"charge_id"')  # a write cut short
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", child], check=False)
    assert proc.returncode == -9

    async def recover() -> tuple[int, int, int]:
        r = await _gate(tmp_path, "next", ledger).recover()
        return r.journals, r.charges, r.torn_lines

    assert asyncio.run(recover()) == (1, 2, 1)
    assert ledger.charged_nanos() == 14_000


async def test_charges_on_an_unknown_hold_are_kept_not_dropped(
    tmp_path: Path, ledger: BudgetLedger, caplog: pytest.LogCaptureFixture
) -> None:
    journal = ChargeJournal(tmp_path / "journal", "ghost")
    journal.append("no-such-hold", Charge("c1", "support", "reply", "m", None, "2026-11-30", 1, 1, 1))
    _die(journal)
    client = InProcessLedgerClient(LedgerService(ledger))

    async def send(hold_id: str, charges: list[Charge]) -> None:
        await client.settle(hold_id, charges, close=True)

    report = await recover_orphans(tmp_path / "journal", send)  # type: ignore[arg-type]
    assert report.kept == 1 and report.charges == 0
    assert journal.path.exists(), "charges that could not be sent must stay on disk"
    assert "no-such-hold" in caplog.text


async def test_switchyard_audit_drain_sends_dead_replicas_charges(
    budget_state: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The operator's command after a node's replica died and none restarted there."""
    state = budget_state
    with closing(open_store(state, Store.LEDGER)) as db:  # where the command will look for it
        ledger = BudgetLedger(db)
        dead = LeasedBudgetGate(
            Admissions(shipped),
            InProcessLedgerClient(LedgerService(ledger)),
            "dead",
            NEVER_FLUSH,
            journal=ChargeJournal(state / "budgets" / "journal", "dead"),
        )
        await _spend(dead, 3)
        before = ledger.charged_nanos()
        _die(dead.journal)
        with KeyStore.in_state_dir(state) as keys:
            key = keys.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)[0]
        drain = ["audit", "drain", "--json", "--state-dir", str(state), "--api-key", key]
        code = await asyncio.to_thread(main, drain)
        out = json.loads(capsys.readouterr().out)
        assert code == 0 and (out["charge_journals"], out["charges"], out["charge_journals_kept"]) == (1, 3, 0)
        assert before < ledger.charged_nanos() == 3 * 123_000


async def _reserve(gate: LeasedBudgetGate) -> tuple[Reservation, int]:
    ps = shipped()
    ctx = wall_clock_ctx(ps)
    estimate = await gate.estimate(ctx, "gpt-4o-mini", [{"role": "user", "content": "hi"}], 16)
    reservation = await gate.reserve(ctx, estimate)
    return reservation, gate._open[reservation.reservation_id][0].amount_nanos


async def test_a_request_in_flight_when_its_replica_dies_is_charged_its_reservation(
    tmp_path: Path, ledger: BudgetLedger
) -> None:
    """Found in CI: a stream whose client was reading it when its replica was killed was
    charged nothing (its provider had billed it). A request in flight at the death is charged
    its whole reservation, once; one that settled is charged what it settled; one released
    (nothing billed) nothing; and an open reservation survives the journal being emptied."""
    dead = _gate(tmp_path, "dead", ledger)
    in_flight, reserved_nanos = await _reserve(dead)
    await _spend(dead, 2)
    for lease in list(dead._leases.values()):
        await dead._flush(lease, close=False)
    await dead.maintain()  # everything settled is in the ledger: the journal is emptied
    assert ledger.charged_nanos() == 2 * 123_000
    released, _ = await _reserve(dead)
    await dead.release(released)
    late, _ = await _reserve(dead)
    await dead.settle(late, [Bill("gpt-4o-mini", Usage(10, 5), 99_000)])
    assert ledger.charged_nanos() == 2 * 123_000, "the test needs charges that never left the replica"
    _die(dead.journal)

    report = await _gate(tmp_path, "survivor", ledger).recover()
    assert report.charges == 2, "the late settle's charge and the in-flight reservation"
    assert reserved_nanos > 0
    assert ledger.charged_nanos() == 2 * 123_000 + 99_000 + reserved_nanos
    again = await _gate(tmp_path, "third", ledger).recover()
    assert again.charges == 0 and ledger.charged_nanos() == 2 * 123_000 + 99_000 + reserved_nanos
    assert in_flight.reservation_id != late.reservation_id


class _LedgerDown(InProcessLedgerClient):
    """A ledger the replica cannot reach until `down` is cleared (a restart, a partition)."""

    def __init__(self, service: LedgerService) -> None:
        super().__init__(service)
        self.down = True

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        if self.down:
            raise ConnectionError("the ledger is restarting")
        return await super().settle(hold_id, charges, close, keep_nanos)


class _AuditPasses:
    """The audit side of a host recovery: notes, at each pass, whether the dead replica's
    journal was still on the host (its stand-ins would wait), and fails its second pass."""

    def __init__(self, journal: Path) -> None:
        self.journal = journal
        self.journal_there: list[bool] = []

    async def recover(self) -> None:
        self.journal_there.append(self.journal.exists())
        if len(self.journal_there) == 2:
            raise OSError("database is locked")


async def test_a_journal_kept_while_the_ledger_was_down_is_sent_by_the_live_replicas_next_pass(
    tmp_path: Path, ledger: BudgetLedger
) -> None:
    """Found reading the recovery (stop 34): a journal kept because the ledger could not be
    reached waited for the next replica to start on the host (or `audit drain`), while the dead
    replica's holds expired and their money was handed out again. A live replica's recovery now
    looks again every pass: a failing pass (ledger down, audit store locked) is logged, and the
    charges land once the ledger answers, before the audit side's pass."""
    dead = _gate(tmp_path, "dead", ledger)
    await _spend(dead, 3)
    journal = _die(dead.journal)
    client = _LedgerDown(LedgerService(ledger))
    ps = shipped()
    survivor = LeasedBudgetGate(
        Admissions(lambda: ps), client, "survivor", NEVER_FLUSH, journal=ChargeJournal(tmp_path / "journal", "survivor")
    )
    audit = _AuditPasses(journal.path)
    recovery = HostRecovery(survivor, audit, every_s=0.05)
    await recovery.recover()  # the replica's startup, the ledger down: kept, not dropped
    assert journal.path.exists() and ledger.charged_nanos() == 0
    recovery.start()
    for _ in range(100):  # the audit side's failing pass, and more, while the ledger is down
        if len(audit.journal_there) >= 4:
            break
        await asyncio.sleep(0.02)
    assert audit.journal_there[:4] == [True] * 4 and ledger.charged_nanos() == 0
    client.down = False
    for _ in range(200):
        if not journal.path.exists() and not audit.journal_there[-1]:
            break
        await asyncio.sleep(0.02)
    await recovery.stop()
    assert ledger.charged_nanos() == 3 * 123_000, "the kept charges never reached the ledger"
    assert not journal.path.exists() and audit.journal_there[-1] is False
    passes = len(audit.journal_there)
    await asyncio.sleep(0.15)
    assert len(audit.journal_there) == passes, "the recovery went on after stop()"


class _SpendingWhileSettling(InProcessLedgerClient):
    """A ledger whose settle lets one more request settle locally while the flush is out, as
    steady load does: the replica's journal is then never all sent at an upkeep."""

    def __init__(self, service: LedgerService) -> None:
        super().__init__(service)
        self.during_settle: Callable[[], Awaitable[object]] | None = None

    async def settle(
        self, hold_id: str, charges: Sequence[Charge], close: bool, keep_nanos: int | None = None
    ) -> list[SoftAlert]:
        if self.during_settle is not None:
            spend, self.during_settle = self.during_settle, None
            await spend()
        return await super().settle(hold_id, charges, close, keep_nanos)


async def test_a_journal_under_steady_load_is_compacted_and_still_loses_nothing(
    tmp_path: Path, ledger: BudgetLedger
) -> None:
    """Under steady load a charge always arrives between a flush and the upkeep's "all sent"
    check, so the journal was never truncated: two lines a request, for ever. Past
    `journal_compact_bytes` it is rewritten with only the unacknowledged charges and the open
    reservations; a replica killed after that still loses nothing and counts nothing twice."""
    client = _SpendingWhileSettling(LedgerService(ledger))
    ps = shipped()
    gate = LeasedBudgetGate(
        Admissions(lambda: ps),
        client,
        "busy",
        dataclasses.replace(NEVER_FLUSH, journal_compact_bytes=1),
        journal=ChargeJournal(tmp_path / "journal", "busy"),
    )
    await _spend(gate, 20)
    open_request, reserved_nanos = await _reserve(gate)
    assert gate.journal is not None
    before = len(gate.journal.path.read_bytes().splitlines())
    client.during_settle = lambda: _spend(gate, 1)  # arrives while the upkeep's flush is out
    await gate.maintain()
    lines = [json.loads(line) for line in gate.journal.path.read_bytes().splitlines()]
    kinds = sorted(next(k for k in line if k != "hold") for line in lines)
    assert before == 41 and kinds == ["charge", "provisional"], kinds  # the late charge, the open request
    assert ledger.charged_nanos() == 20 * 123_000
    _die(gate.journal)

    report = await _gate(tmp_path, "survivor", ledger).recover()
    assert report.charges == 2
    assert ledger.charged_nanos() == 21 * 123_000 + reserved_nanos
    assert open_request.usd > 0


async def test_a_recoverer_leaves_a_journal_its_live_writer_compacted_under_it_alone(
    tmp_path: Path, ledger: BudgetLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found reading the recovery: a recoverer that opened a live replica's journal just
    before the replica compacted it (a new file renamed over it, the old one closed) got the
    old file's lock; it then read the new, live journal by its path, charged its open
    request's whole reservation (the request's own charge, under the same id, was then a
    duplicate) and unlinked the journal under its writer. The interleaving is forced here:
    the writer compacts between the recoverer's open and its lock."""
    live = _gate(tmp_path, "live", ledger)
    await _spend(live, 2)  # settled, not yet sent: in the journal
    open_request, reserved_nanos = await _reserve(live)  # its reservation is in the journal too
    journal = live.journal
    assert journal is not None
    flock = fcntl.flock
    compacted: list[bool] = []

    def compact_before_the_recoverers_lock(fd: int, operation: int) -> None:
        if operation & fcntl.LOCK_NB and not compacted:  # the recoverer's try, after its open
            compacted.append(True)
            journal.rewrite(live._unsent())
        flock(fd, operation)

    monkeypatch.setattr(fcntl, "flock", compact_before_the_recoverers_lock)
    report = await _gate(tmp_path, "successor", ledger).recover()
    monkeypatch.undo()
    assert compacted and (report.journals, report.charges) == (0, 0)
    assert ledger.charged_nanos() == 0, "the live replica's charges and open reservation were sent"
    assert journal.path.exists(), "the live replica's journal was unlinked under it"
    await live.settle(open_request, [Bill("gpt-4o-mini", Usage(10, 5), 5_000)])
    await live.aclose()
    assert ledger.charged_nanos() == 2 * 123_000 + 5_000 < 2 * 123_000 + reserved_nanos


def test_a_line_the_disk_cut_short_never_swallows_the_next(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found reading the journal (stop 43): `os.write`'s count was not looked at, so a short
    write (a full disk) left a fragment that the next charge's line extended into one line
    recovery reads as torn, losing both; and a failed write raised out of a settlement half
    done. Now the fragment is cut and the failure logged: every later line is whole."""
    journal = ChargeJournal(tmp_path, "replica-1")
    journal.open()
    real_write, faults = os.write, ["short", "enospc"]

    def full_disk(fd: int, data: bytes) -> int:
        if faults and fd == journal._fd:
            fault = faults.pop(0)
            if fault == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data[: len(data) // 2])
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full_disk)
    lost = [Charge(f"r{n}", "support", "reply", "gpt-4o-mini", None, "2026-12-05", 1_000, 10, 5) for n in range(2)]
    kept = Charge("r2", "support", "reply", "gpt-4o-mini", None, "2026-12-05", 2_000, 10, 5)
    for charge in [*lost, kept]:
        journal.append("hold-1", charge)
    content = read_journal(journal.path.read_bytes(), journal.path)
    assert (content.by_hold, content.torn, content.unreadable) == ({"hold-1": [kept]}, 0, [])
