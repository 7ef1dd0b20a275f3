"""The audit spool against damaged files and full disks.

A writer's spool file holds a drawn list of records; then one thing happens to it: a byte
changed, a line deleted, doubled, swapped with the next or preceded by junk, or the end cut off.
The drain must then store exactly the records whose lines were left whole, each as written,
keep every other complete line aside as it was, and count a cut last line as torn.

Found by this test (stop 44), each failing on the code before: a changed byte that still
parsed (a digit of a cost, a letter of a team) was stored and chained as the record. The chain
hashes a record only once it is drained; each spool line now carries a CRC-32.

Pure (no Ray): `make test` runs `examples(60)` files.
"""

from __future__ import annotations

import errno
import os
import tempfile
from pathlib import Path

import pytest
from _audit_helpers import make_exchange
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.audit.builder import PendingEntry, RecordBuilder
from switchyard.audit.record import canonical_json
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.spool import UNREADABLE, AuditSpool, decode_line, drain_file, encode_line
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.gateway.seams import AuditUnavailable
from switchyard.policy.models import DataPolicies
from tests.examples import examples
from tests.mutations import damage_lines


@pytest.fixture(scope="module")
def records(
    tmp_path_factory: pytest.TempPathFactory, data_policies: DataPolicies, scrubber: TextScrubber
) -> list[PendingEntry]:
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path_factory.mktemp("keys")))
    return [
        builder.build(make_exchange(user=f"u-{n}", text=f"question {n}", output=f"answer {n}", cost_usd=0.001 * n))
        for n in range(8)
    ]


def _without_checksum(line: bytes) -> bytes:
    """A record's line as written before checksums, among lines that have them."""
    return line[: line.rfind(b',"crc32":')] + b"}"


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_a_drain_stores_each_whole_line_as_written_and_keeps_the_rest(
    records: list[PendingEntry], data: st.DataObject
) -> None:
    written = data.draw(st.lists(st.sampled_from(records), min_size=1, max_size=6, unique_by=id), label="records")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "spool" / "w.1.spool"
        path.parent.mkdir()
        original = b"".join(encode_line(r) for r in written)
        path.write_bytes(original)
        what = damage_lines(path, data, _without_checksum)
        content = path.read_bytes()
        whole = set(original.split(b"\n")[:-1])
        *complete, tail = content.split(b"\n")
        left = [line for line in complete if line in whole]
        others = [line for line in complete if line and line not in whole]
        if tail in whole:  # a whole record that lost only its newline: stored as written
            left.append(tail)
            tail = b""
        expected = {}
        for line in left:
            record = decode_line(line).record
            expected.setdefault(record.request_id, canonical_json(record))

        store = AuditStore.in_state_dir(Path(tmp) / "state")
        try:
            report = drain_file(path, store)
            stored = {e.entry.request_id: canonical_json(e.entry) for e in store.find(limit=100)}
        finally:
            store.close()
        assert stored == expected, f"{what}: stored {sorted(stored)}, the whole lines hold {sorted(expected)}"
        aside = path.with_name(path.name + UNREADABLE)
        kept = aside.read_bytes().split(b"\n")[:-1] if aside.exists() else []
        assert sorted(kept) == sorted(others), f"{what}: kept aside {len(kept)} lines, not the {len(others)} changed"
        assert (report.unreadable, report.torn_lines) == (len(others), 1 if tail else 0), f"{what}: {report}"


async def test_a_stand_ins_compaction_on_a_full_disk_keeps_every_open_stream(
    tmp_path: Path, records: list[PendingEntry], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found reading the spool (stop 44): compacting the stand-ins file wrote it aside without
    looking at `write`'s count and renamed it over the old one, so on a full disk the stand-ins
    of streams still open were lost (a dead writer's stream then had no record at all). And a
    short write of a new stand-in was undone by rewriting the whole file, which needs the space
    the disk had just refused. Now the compaction keeps the old file, and the fragment is cut."""
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    first, second, closed, refused = records[:4]
    for stand_in in (first, second, closed):
        await spool.open_stream(stand_in, durable=False)
    spool.close_stream(closed.record.request_id)
    real_write, faults = os.write, ["short", "enospc", "short"]

    def full_disk(fd: int, data: bytes) -> int:
        if faults:
            fault = faults.pop(0)
            if fault == "enospc":
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_write(fd, data[: len(data) // 2])
        return real_write(fd, data)

    with monkeypatch.context() as patched:
        patched.setattr(os, "write", full_disk)
        spool.compact_streams()  # short
        spool.compact_streams()  # ENOSPC
        with pytest.raises(AuditUnavailable, match="short write"):
            await spool.open_stream(refused, durable=False)
    lines = spool._streams_path().read_bytes().split(b"\n")
    assert lines[-1] == b"", "a fragment was left as the file's last bytes"
    held = {decode_line(line).record.request_id for line in lines[:-1]}
    assert {first.record.request_id, second.record.request_id} <= held, held
    assert refused.record.request_id not in held
    await spool.stop()
    store.close()
