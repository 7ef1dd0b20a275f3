"""Several writers, one database: one chain, one key per subject (SQLite and Postgres).

Each writer is a store over a connection of its own, as a gateway replica in another process
or on another host opens one; each has its own anchor file, as each host has.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from _audit_helpers import make_exchange
from _audit_stores import AuditDatabases, another_connection, store_on

from switchyard.audit.anchors import ANCHORS_FILE
from switchyard.audit.builder import PendingEntry, RecordBuilder
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import KeyErased, SubjectKeyring
from switchyard.policy.models import DataPolicies

WRITERS = 4


@pytest.fixture
def builder(keyring: SubjectKeyring, data_policies: DataPolicies, scrubber: TextScrubber) -> RecordBuilder:
    return RecordBuilder(data_policies, scrubber, keyring)


@pytest.fixture
def writers(audit_databases: AuditDatabases, tmp_path: Path) -> Iterator[list[AuditStore]]:
    """`WRITERS` stores on the audit database, each on its own connection and host's anchors."""
    stores = [
        store_on(another_connection(audit_databases[0]), tmp_path / f"host-{n}" / ANCHORS_FILE) for n in range(WRITERS)
    ]
    yield stores
    for store in stores:
        store.close()


@pytest.fixture
def keyrings(audit_databases: AuditDatabases, backend: str) -> Iterator[list[SubjectKeyring]]:
    """`WRITERS` keyrings on the key database, each on its own connection."""
    rings = [
        SubjectKeyring(another_connection(audit_databases[1], secure_delete=backend == "sqlite"))
        for _ in range(WRITERS)
    ]
    yield rings
    for ring in rings:
        ring.close()


def _in_threads(work: list[Callable[[], None]]) -> None:
    """Run every callable in a thread of its own; re-raise the first failure."""
    failures: list[BaseException] = []

    def run(fn: Callable[[], None]) -> None:
        try:
            fn()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread, which raises it
            failures.append(exc)

    threads = [threading.Thread(target=run, args=(fn,)) for fn in work]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not [t for t in threads if t.is_alive()], "a writer hung"
    if failures:
        raise failures[0]


def test_concurrent_writers_form_one_chain(writers: list[AuditStore], builder: RecordBuilder) -> None:
    """Four writers append batches (of 1 to 3 entries) at once while a fifth thread seals
    segments: every writer's view verifies, seqs run 1..N without a gap, the segments tile."""
    batches = [[[builder.build(make_exchange()) for _ in range(1 + (b % 3))] for b in range(12)] for _ in writers]
    start = threading.Barrier(len(writers) + 1)
    appended = threading.Event()

    def append(store: AuditStore, mine: list[list[PendingEntry]]) -> Callable[[], None]:
        def go() -> None:
            start.wait()
            for batch in mine:
                assert store.append(batch) == len(batch)

        return go

    def seal() -> None:
        start.wait()
        while not appended.is_set():
            writers[0].seal_segments(size=5)

    sealer = threading.Thread(target=seal)
    sealer.start()
    try:
        _in_threads([append(store, mine) for store, mine in zip(writers, batches, strict=True)])
    finally:
        appended.set()
        sealer.join(timeout=60)
    writers[-1].seal_segments(size=5, include_partial=True)

    total = sum(len(batch) for mine in batches for batch in mine)
    rows = list(writers[0].rows())
    assert [r.seq for r in rows] == list(range(1, total + 1))
    segments = writers[0].segments()
    assert [(s.first_seq, s.last_seq) for s in segments] == [
        (first, min(first + 4, total)) for first in range(1, total + 1, 5)
    ]
    for store in writers:
        assert store.verify() == [], store.anchors.path


def test_a_deleted_tail_is_found_after_new_appends(
    audit_databases: AuditDatabases, tmp_path: Path, builder: RecordBuilder
) -> None:
    """Appends number entries from the head: deleting the tail and appending again makes a
    valid chain with the old seqs, which this host's anchors still tell apart."""
    anchors = tmp_path / "audit" / ANCHORS_FILE
    store = store_on(audit_databases[0], anchors)
    for _ in range(5):
        store.append([builder.build(make_exchange())])
    store.anchors.flush()
    with store.db.transaction() as tx:
        tx.execute("DELETE FROM entries WHERE seq >= 4")
    assert [(f.seq, f.problem) for f in store.verify()] == [(5, "truncated")]
    store.append([builder.build(make_exchange()) for _ in range(2)])  # seqs 4 and 5 again
    assert [r.seq for r in store.rows()] == [1, 2, 3, 4, 5]
    problems = [f.problem for f in store.verify()]
    assert problems == ["anchor_mismatch"], problems


def test_a_host_that_anchored_nothing_is_only_a_finding_on_sqlite(
    backend: str, writers: list[AuditStore], builder: RecordBuilder
) -> None:
    """On Postgres another host may have appended everything; an anchor this host did write
    still catches the entry it names being removed."""
    appender, bystander = writers[0], writers[1]
    for _ in range(4):
        appender.append([builder.build(make_exchange())])
    appender.anchors.flush()
    assert appender.verify() == []
    expected = ["anchor_mismatch"] if backend == "sqlite" else []  # "anchors nothing although ..."
    assert [f.problem for f in bystander.verify()] == expected
    with appender.db.transaction() as tx:
        tx.execute("DELETE FROM entries WHERE seq = 4")
    assert [(f.seq, f.problem) for f in appender.verify()] == [(4, "truncated")]


def test_keyrings_racing_for_a_new_subject_agree_on_its_key(keyrings: list[SubjectKeyring]) -> None:
    subjects = [f"support/u-{n}" for n in range(20)]
    seen: list[dict[str, tuple[str, bytes]]] = [{} for _ in keyrings]
    start = threading.Barrier(len(keyrings))

    def race(ring: SubjectKeyring, mine: dict[str, tuple[str, bytes]]) -> Callable[[], None]:
        def go() -> None:
            for subject in subjects:
                start.wait()  # every keyring meets each new subject at once
                mine[subject] = ring.key_for(subject)

        return go

    _in_threads([race(ring, mine) for ring, mine in zip(keyrings, seen, strict=True)])
    for subject in subjects:
        assert len({got[subject] for got in seen}) == 1, subject
    with keyrings[0].db.read() as tx:
        row = tx.execute("SELECT COUNT(*) FROM subject_keys").one()
    assert row is not None and row[0] == len(subjects)


def test_an_erased_key_is_gone_for_every_keyring(keyrings: list[SubjectKeyring]) -> None:
    eraser, other = keyrings[0], keyrings[1]
    key_id, key = other.key_for("support/u-gone")
    assert eraser.key_by_id(key_id) == key
    alias = other.existing_pseudonym("support/u-gone")
    assert alias is not None and eraser.erase("support/u-gone", erased_by="aud1") == alias
    with pytest.raises(KeyErased):
        other.key_by_id(key_id)
    assert other.existing_pseudonym("support/u-gone") is None
    assert other.key_for("support/u-gone")[0] != key_id  # a new key for new requests
