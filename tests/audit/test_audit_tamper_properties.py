"""`audit verify` against generated tampering.

A chain is written as requests arrive (records of every data class, sealed into segments at
drawn points), closed and reopened. Untouched, it verifies clean. Then one edit of the
database, as anyone with its credentials could make it (the anchor file is left alone: docs/
audit.md says what an edit of both can hide), and `verify` must report something. The edits
are drawn from every kind there is: a payload, a hash, a link, the columns queries select by,
deletions, insertions and reorderings with the chain relinked around them, bodies, their
retention and the segment rows. Hypothesis prints the failing chain and edit.

`make test` runs `examples(60)` chains (SQLite, about 10 s); `SWITCHYARD_EXAMPLES_SCALE`
runs more.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest
from _audit_helpers import make_exchange, make_flow
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from switchyard.audit.builder import PendingEntry, RecordBuilder
from switchyard.audit.chain import GENESIS, link_hash
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.db.engine import Transaction
from switchyard.policy.models import DataPolicies
from tests.examples import examples

CLASSES = ("public", "internal", "personal", "regulated")  # bodies kept in clear, sealed, as hashes
POOL = 12  # the most records a drawn chain holds


@pytest.fixture(scope="module")
def pool(
    tmp_path_factory: pytest.TempPathFactory, data_policies: DataPolicies, scrubber: TextScrubber
) -> list[PendingEntry]:
    """Records (and their bodies) of every data class and a few subjects, built once."""
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path_factory.mktemp("pool")))
    return [
        builder.build(make_exchange(flow=make_flow(data_class=CLASSES[i % len(CLASSES)]), user=f"u{i % 3}"))
        for i in range(POOL)
    ]


def _write_chain(state: Path, pool: list[PendingEntry], n: int, seal_sizes: list[int]) -> AuditStore:
    """`n` records appended one at a time; after record i, segments of `seal_sizes[i]` are
    sealed (0: none); closed (anchoring its head) and reopened."""
    store = AuditStore.in_state_dir(state)
    for i in range(n):
        store.append([pool[i]])
        if seal_sizes[i]:
            store.seal_segments(size=seal_sizes[i])
    store.close()
    return AuditStore.in_state_dir(state)


# ---------------------------------------------------------------- the edits

Draw = Callable[[st.SearchStrategy[int]], int]


def _rows(tx: Transaction) -> list[tuple[int, str, str, str]]:
    return [
        (int(r[0]), r[1], r[2], r[3])
        for r in tx.execute("SELECT seq, payload, prev_hash, hash FROM entries ORDER BY seq").rows
    ]


def _relink(tx: Transaction, start: int) -> None:
    """Recompute every link from entry `start` on, as a forger covering an edit would."""
    prev = GENESIS
    for seq, payload, _, digest in _rows(tx):
        if seq >= start:
            digest = link_hash(prev, payload)
            tx.execute("UPDATE entries SET prev_hash = ?, hash = ? WHERE seq = ?", (prev, digest, seq))
        prev = digest


def _shift(tx: Transaction, after: int, by: int) -> None:
    """Renumber the entries past `after` by `by` (through negatives: seq is unique)."""
    tx.execute("UPDATE entries SET seq = -seq WHERE seq > ?", (after,))
    tx.execute("UPDATE entries SET seq = -seq + ? WHERE seq < 0", (by,))


def _edited(payload: str, field: str) -> str:
    """`payload` with one field changed, written as the store writes payloads."""
    data = json.loads(payload)
    value = data.get(field)
    if isinstance(value, bool) or value is None:
        data[field] = "forged"
    elif isinstance(value, int | float):
        data[field] = value + 1
    else:
        data[field] = f"{value}-forged"
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


PAYLOAD_FIELDS = ("team", "cost_usd", "status_code", "time", "request_id", "flow")
NOT_ENTRIES = ("not json", "[1, 2]", '{"kind": "request"}', "", '{"kind": "access", "request_id": 7}')
COLUMNS = ("request_id", "kind", "team", "flow", "time")


def edit_payload(tx: Transaction, n: int, draw: Draw) -> str:
    seq, field = draw(st.integers(1, n)), PAYLOAD_FIELDS[draw(st.integers(0, len(PAYLOAD_FIELDS) - 1))]
    (payload,) = tx.execute("SELECT payload FROM entries WHERE seq = ?", (seq,)).rows[0]
    tx.execute("UPDATE entries SET payload = ? WHERE seq = ?", (_edited(payload, field), seq))
    how = draw(st.integers(0, 2))  # 0: as is; 1: its own hash recomputed; 2: the chain relinked from it
    if how == 1:
        _rehash_one(tx, seq)
    elif how == 2:
        _relink(tx, seq)
    return f"entry {seq}'s {field} edited, " + ("hash left", "its hash recomputed", "the chain relinked")[how]


def _rehash_one(tx: Transaction, seq: int) -> None:
    (prev, payload) = tx.execute("SELECT prev_hash, payload FROM entries WHERE seq = ?", (seq,)).rows[0]
    tx.execute("UPDATE entries SET hash = ? WHERE seq = ?", (link_hash(prev, payload), seq))


def replace_payload(tx: Transaction, n: int, draw: Draw) -> str:
    seq, junk = draw(st.integers(1, n)), NOT_ENTRIES[draw(st.integers(0, len(NOT_ENTRIES) - 1))]
    tx.execute("UPDATE entries SET payload = ? WHERE seq = ?", (junk, seq))
    if draw(st.booleans()):
        _relink(tx, seq)
    return f"entry {seq}'s payload replaced by {junk!r}"


def edit_link(tx: Transaction, n: int, draw: Draw) -> str:
    seq, column = draw(st.integers(1, n)), ("hash", "prev_hash")[draw(st.integers(0, 1))]
    tx.execute(f"UPDATE entries SET {column} = ? WHERE seq = ?", ("f" * 64, seq))
    return f"entry {seq}'s {column} replaced"


def edit_column(tx: Transaction, n: int, draw: Draw) -> str:
    seq, column = draw(st.integers(1, n)), COLUMNS[draw(st.integers(0, len(COLUMNS) - 1))]
    (value,) = tx.execute(f"SELECT {column} FROM entries WHERE seq = ?", (seq,)).rows[0]
    forged = (
        value + 3600.0
        if column == "time"
        else ("access" if value == "request" else "request")
        if column == "kind"
        else f"{value}-forged"
    )
    tx.execute(f"UPDATE entries SET {column} = ? WHERE seq = ?", (forged, seq))
    return f"entry {seq}'s {column} column set to {forged!r}"


def delete_entries(tx: Transaction, n: int, draw: Draw) -> str:
    first = draw(st.integers(1, n))
    last = draw(st.integers(first, n))
    tx.execute("DELETE FROM entries WHERE seq BETWEEN ? AND ?", (first, last))
    how = draw(st.integers(0, 1)) if last < n else 0  # 1: the rest renumbered and relinked
    if how:
        _shift(tx, last, -(last - first + 1))
        _relink(tx, first)
    return f"entries {first}..{last} deleted" + (", the rest renumbered and relinked" if how else "")


def insert_entry(tx: Transaction, n: int, draw: Draw) -> str:
    seq = draw(st.integers(1, n))
    (payload,) = tx.execute("SELECT payload FROM entries WHERE seq = ?", (draw(st.integers(1, n)),)).rows[0]
    forged = _edited(payload, "request_id")
    _shift(tx, seq - 1, 1)
    data = json.loads(forged)
    tx.execute(
        "INSERT INTO entries (seq, request_id, kind, team, flow, time, payload, prev_hash, hash)"
        " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
        (seq, data["request_id"], data["kind"], data.get("team"), data.get("flow"), data["time"], forged, "", ""),
    )
    _relink(tx, seq)
    return f"a forged entry inserted at {seq}, the chain relinked"


def swap_entries(tx: Transaction, n: int, draw: Draw) -> str:
    a = draw(st.integers(1, n - 1))
    b = draw(st.integers(a + 1, n))
    tx.execute("UPDATE entries SET seq = -1 WHERE seq = ?", (a,))
    tx.execute("UPDATE entries SET seq = ? WHERE seq = ?", (a, b))
    tx.execute("UPDATE entries SET seq = ? WHERE seq = -1", (b,))
    if draw(st.booleans()):
        _relink(tx, a)
    return f"entries {a} and {b} swapped"


def _bodies(tx: Transaction) -> list[tuple[str, str]]:
    return [(r[0], r[1]) for r in tx.execute("SELECT request_id, part FROM bodies ORDER BY request_id, part").rows]


def edit_body(tx: Transaction, n: int, draw: Draw) -> str:
    bodies = _bodies(tx)
    rid, part = bodies[draw(st.integers(0, len(bodies) - 1))]
    how = draw(st.integers(0, 3))
    if how == 0:
        (data,) = tx.execute("SELECT data FROM bodies WHERE request_id = ? AND part = ?", (rid, part)).rows[0]
        data = bytes(data)
        at = draw(st.integers(0, len(data) - 1))
        tx.execute(
            "UPDATE bodies SET data = ? WHERE request_id = ? AND part = ?",
            (data[:at] + bytes([data[at] ^ 1]) + data[at + 1 :], rid, part),
        )
        return f"a byte of {rid}'s {part} body flipped"
    if how == 1:
        tx.execute("DELETE FROM bodies WHERE request_id = ? AND part = ?", (rid, part))
        return f"{rid}'s {part} body deleted"
    if how == 2:
        tx.execute("UPDATE bodies SET expires_at = 0 WHERE request_id = ? AND part = ?", (rid, part))
        tx.execute("DELETE FROM bodies WHERE expires_at <= 0")  # what the next retention purge does
        return f"{rid}'s {part} body's retention cut short, then purged"
    other = [b for b in bodies if b != (rid, part)]
    if not other:
        tx.execute("UPDATE bodies SET data = ? WHERE request_id = ? AND part = ?", (b"forged", rid, part))
        return f"{rid}'s {part} body replaced"
    orid, opart = other[draw(st.integers(0, len(other) - 1))]
    tx.execute(
        "UPDATE bodies SET data = (SELECT data FROM bodies WHERE request_id = ? AND part = ?)"
        " WHERE request_id = ? AND part = ?",
        (orid, opart, rid, part),
    )
    return f"{rid}'s {part} body replaced by {orid}'s {part if opart == part else opart}"


def edit_segment(tx: Transaction, n: int, draw: Draw) -> str:
    numbers = [int(r[0]) for r in tx.execute("SELECT segment_no FROM segments ORDER BY segment_no").rows]
    number = numbers[draw(st.integers(0, len(numbers) - 1))]
    how = draw(st.integers(0, 3))
    if how == 0:
        tx.execute("DELETE FROM segments WHERE segment_no = ?", (number,))
        return f"segment {number}'s row deleted"
    column = ("first_seq", "last_seq", "last_hash")[how - 1]
    value: object = "f" * 64 if column == "last_hash" else draw(st.integers(0, n + 1))
    (old,) = tx.execute(f"SELECT {column} FROM segments WHERE segment_no = ?", (number,)).rows[0]
    if value == old:
        value = "e" * 64 if column == "last_hash" else int(old) + 1
    tx.execute(f"UPDATE segments SET {column} = ? WHERE segment_no = ?", (value, number))
    return f"segment {number}'s {column} set to {value}"


EDITS = {
    f.__name__: f
    for f in (
        edit_payload,
        replace_payload,
        edit_link,
        edit_column,
        delete_entries,
        insert_entry,
        swap_entries,
        edit_body,
        edit_segment,
    )
}


def _applicable(tx: Transaction, n: int) -> list[str]:
    has_bodies = bool(_bodies(tx))
    has_segments = tx.execute("SELECT 1 FROM segments").one() is not None
    return [
        name
        for name in EDITS
        if (name != "swap_entries" or n >= 2)
        and (name != "edit_body" or has_bodies)
        and (name != "edit_segment" or has_segments)
    ]


CHAINS = st.integers(1, POOL).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.sampled_from([0, 0, 0, 1, 2, 3, 4]), min_size=n, max_size=n))
)


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(chain=CHAINS, data=st.data())
def test_every_edit_of_the_database_is_reported(
    pool: list[PendingEntry], chain: tuple[int, list[int]], data: st.DataObject
) -> None:
    n, seals = chain
    with tempfile.TemporaryDirectory() as state:
        store = _write_chain(Path(state), pool, n, seals)
        try:
            assert store.verify() == [], "an untouched chain"
            with store.db.transaction() as tx:
                name = data.draw(st.sampled_from(_applicable(tx, n)), label="edit")
                what = EDITS[name](tx, n, lambda s: data.draw(s))
            findings = store.verify()
            assert findings, f"{what}: verify reported nothing"
        finally:
            store.close()
