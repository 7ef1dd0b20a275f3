"""The charge journal against generated histories, full disks and damaged files.

A writer journals a drawn history of reservations, settlements (one to three charges each),
releases, flushes to the ledger and compactions, some compactions on a disk that is full; then
it dies. Undamaged, recovery must send every charge the ledger has not acknowledged and the
reservation of every request still open, each charge once, and nothing the writer never
journaled. Then one thing happens to the file: a byte changed, a line deleted, doubled, swapped
with the next or preceded by junk, or the end cut off. Recovery must then send exactly what the
lines left whole say (a request whose charge line is damaged is charged its reservation when
that line is still there), keep every other complete line aside as it was, and count a cut
last line as torn. Nothing it sends may differ from what the writer wrote.

Found by this test (stop 44), each failing on the code before:
- a changed digit of an amount still parsed, and recovery charged the changed amount;
- a damaged line was dropped with the journal when recovery deleted it: the money it stood
  for was gone from the ledger and the disk;
- a compaction on a full disk renamed a partial file over the journal, losing charges the
  ledger had not acknowledged; `clear` truncated the journal in place before writing the open
  reservations back, and lost them the same way;
- a doubled line was sent as two charges (the ledger counts an id once; the report did not).

Pure (no Ray, no ledger): `make test` runs `examples(120)` histories.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.budgets.charge_journal import UNREADABLE, ChargeJournal, read_journal, recover_orphans
from switchyard.budgets.ledger import Charge
from switchyard.sealed_json import CHECKSUM
from tests.examples import examples
from tests.mutations import damage_lines

HOLDS = ("hold-a", "hold-b")
Sent = dict[str, dict[str, Charge]]  # hold -> charge id -> charge


@dataclass
class _Writer:
    """The journal and what its writer knows: which charges the ledger acknowledged."""

    journal: ChargeJournal
    reserved: dict[str, tuple[str, Charge]] = field(default_factory=dict)  # open requests
    unsent: list[tuple[str, Charge]] = field(default_factory=list)
    journaled: set[tuple[str, Charge]] = field(default_factory=set)  # everything ever written


def _charge(charge_id: str, nanos: int) -> Charge:
    return Charge(charge_id, "support", "reply", "gpt-4o-mini", None, "2026-12-07", nanos, 10, 5)


@contextmanager
def _full_disk(how: str) -> Any:
    """The next `os.write` stores half its bytes ("short") or none ("enospc")."""
    real = os.write
    faults = [how]

    def write(fd: int, data: bytes) -> int:
        if not faults:
            return real(fd, data)
        faults.pop()
        if how == "enospc":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data[: len(data) // 2])

    with mock.patch.object(os, "write", write):
        yield


def _history(directory: Path, data: st.DataObject) -> _Writer:
    writer = _Writer(ChargeJournal(directory, "replica-1"))
    writer.journal.open()
    for n in range(data.draw(st.integers(1, 14), label="steps")):
        op = data.draw(st.sampled_from(["reserve", "reserve", "settle", "settle", "release", "flush", "compact"]))
        disk = data.draw(st.sampled_from(["ok", "ok", "short", "enospc"]), label="disk") if op == "compact" else "ok"
        if op == "reserve" or (not writer.reserved and op in ("settle", "release")):
            hold, request = data.draw(st.sampled_from(HOLDS)), f"r{n}"
            provisional = _charge(request, data.draw(st.integers(1, 10**9)))
            writer.journal.reserve(hold, provisional)
            writer.reserved[request] = (hold, provisional)
            writer.journaled.add((hold, provisional))
        elif op == "settle":
            request = data.draw(st.sampled_from(sorted(writer.reserved)))
            hold, _ = writer.reserved.pop(request)
            count = data.draw(st.integers(1, 3), label="charges")
            for i in range(count):
                charge = _charge(request if i == 0 else f"{request}.{i + 1}", data.draw(st.integers(0, 10**9)))
                writer.journal.append(hold, charge)
                writer.unsent.append((hold, charge))
                writer.journaled.add((hold, charge))
            writer.journal.settled(request)
        elif op == "release":
            request = data.draw(st.sampled_from(sorted(writer.reserved)))
            writer.reserved.pop(request)
            writer.journal.released(request)
        elif op == "flush":  # the ledger acknowledged the oldest charges
            del writer.unsent[: data.draw(st.integers(0, len(writer.unsent)), label="acknowledged")]
        else:
            with _full_disk(disk) if disk != "ok" else nullcontext():
                if writer.unsent:
                    writer.journal.rewrite(writer.unsent)
                else:
                    writer.journal.clear()
    assert writer.journal._fd is not None
    os.close(writer.journal._fd)  # the writer dies: its lock goes, the file stays
    return writer


def _entry(line: bytes) -> dict[str, Any]:
    return {k: v for k, v in json.loads(line).items() if k != CHECKSUM}


def _what_lines_say(lines: Sequence[bytes]) -> Sent:
    """What a journal made of `lines` (whole, undamaged entries) stands for: its settled
    charges, and the reservation of each request with no charge line and no release line."""
    sent: Sent = {}
    closed: set[str] = set()
    provisional: list[tuple[str, Charge]] = []
    for entry in map(_entry, lines):
        if "released" in entry:
            closed.add(entry["released"])
        elif "provisional" in entry:
            provisional.append((entry["hold"], Charge(**entry["provisional"])))
        else:
            charge = Charge(**entry["charge"])
            sent.setdefault(entry["hold"], {})[charge.charge_id] = charge
            closed.add(charge.charge_id.split(".", 1)[0])
    for hold, charge in provisional:
        if charge.charge_id not in closed:
            sent.setdefault(hold, {})[charge.charge_id] = charge
    return sent


def _forged(_: bytes) -> bytes:
    """An entry without the checksum its neighbours carry."""
    return b'{"hold":"hold-a","charge":' + json.dumps(vars(_charge("forged", 1))).encode() + b"}"


def _recover(directory: Path) -> tuple[Sent, Any]:
    sent: Sent = {}

    async def send(hold: str, charges: Sequence[Charge]) -> None:
        for charge in charges:
            assert charge.charge_id not in sent.get(hold, {}), f"{charge.charge_id} sent twice"
            sent.setdefault(hold, {})[charge.charge_id] = charge

    report = asyncio.run(recover_orphans(directory, send))
    return sent, report


def _check(condition: bool, what: str, explain: Callable[[], str]) -> None:
    assert condition, f"{what}: {explain()}"


@settings(max_examples=examples(120), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_recovery_sends_what_the_journal_says_and_keeps_damaged_lines(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "journal"
        writer = _history(directory, data)
        path = writer.journal.path
        original = path.read_bytes()
        whole = original.split(b"\n")[:-1]
        assert original.endswith(b"\n") or not original, "the writer left a fragment"

        # Undamaged: every unacknowledged charge and open reservation, once, as written.
        truth = _what_lines_say(whole)
        for hold, charge in writer.unsent + list(writer.reserved.values()):
            assert truth.get(hold, {}).get(charge.charge_id) == charge, f"{charge} is not in the journal"
        for hold, charges in truth.items():
            for charge in charges.values():
                assert (hold, charge) in writer.journaled, f"{charge} was never journaled"

        damaged = data.draw(st.booleans(), label="damaged")
        what = damage_lines(path, data, _forged) if damaged and original else "undamaged"
        content = path.read_bytes()
        after = content.split(b"\n")
        complete, tail = after[:-1], after[-1]
        left_whole = [line for line in complete if line in set(whole)]
        others = [line for line in complete if line not in set(whole) and line]
        if tail in set(whole):  # a whole entry that lost only its newline: read as written
            left_whole.append(tail)
            tail = b""

        read = read_journal(content, path)
        got = {hold: {c.charge_id: c for c in charges} for hold, charges in read.by_hold.items()}
        expected = _what_lines_say(left_whole)
        _check(got == expected, what, lambda: f"recovery read {got}, the whole lines say {expected}")
        _check(sorted(read.unreadable) == sorted(others), what, lambda: f"kept aside {read.unreadable}, not {others}")
        _check(read.torn == (1 if tail else 0), what, lambda: f"{read.torn} torn, the tail is {tail!r}")

        sent, report = _recover(directory)
        _check(sent == expected, what, lambda: f"recovery sent {sent}, the whole lines say {expected}")
        _check(not path.exists(), what, lambda: "the recovered journal is still there")
        aside = path.with_name(path.name + UNREADABLE)
        kept = aside.read_bytes().split(b"\n")[:-1] if aside.exists() else []
        _check(sorted(kept) == sorted(others), what, lambda: f"{aside.name} holds {kept}, not {others}")
        _check(report.unreadable == len(others), what, lambda: f"reported {report.unreadable} lines kept aside")
        _check(
            report.charges == sum(len(c) for c in expected.values()),
            what,
            lambda: f"reported {report.charges} charges for {expected}",
        )
