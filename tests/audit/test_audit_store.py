"""The audit store: records per policy, tamper detection, erasure and retention, on SQLite
and on Postgres (`backend`)."""

from __future__ import annotations

import asyncio
import json

import pytest
from _audit_helpers import EMAIL, make_exchange, make_flow

from switchyard.audit.builder import DAY_S, BodyBlob, PendingEntry, RecordBuilder
from switchyard.audit.erasure import erase_subject
from switchyard.audit.query import AuditQuery, AuditReader
from switchyard.audit.record import RequestRecord, StoredBody, parse_entry
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import KeyErased, SubjectKeyring, plain_digest
from switchyard.db.engine import SqliteDatabase
from switchyard.gateway.seams import Attempt, Bill, Usage
from switchyard.policy.keys import Principal
from switchyard.policy.models import BodyStorage, DataPolicies, Role

AUDITOR = Principal("aud1", "platform", Role.AUDITOR)


@pytest.fixture
def parts(
    audit_store: AuditStore, keyring: SubjectKeyring, data_policies: DataPolicies, scrubber: TextScrubber
) -> tuple[AuditStore, SubjectKeyring, RecordBuilder]:
    return audit_store, keyring, RecordBuilder(data_policies, scrubber, keyring)


def _fill(store: AuditStore, builder: RecordBuilder, n: int, **kw: object) -> list[str]:
    exchanges = [make_exchange(**kw) for _ in range(n)]  # type: ignore[arg-type]
    store.append([builder.build(x) for x in exchanges])
    return [x.ctx.request_id for x in exchanges]


def test_record_carries_the_issue_fields(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    [rid] = _fill(store, builder, 1)
    [stored] = store.find(team="support")
    record = stored.entry
    assert isinstance(record, RequestRecord)
    assert record.request_id == rid and record.schema_version == 3
    assert record.user is not None and record.user.startswith("p-") and record.subject == record.user
    assert record.prompt_ref == "support-reply@2#abcdef123456" and record.provider == "openai"
    assert record.attempts[0].model_version == "gpt-4o-mini-2024-07-18"
    assert record.tokens is not None and record.tokens.prompt == 40 and record.cost_usd == 0.0012
    assert record.redaction.mode == "reversible"
    assert record.redaction.stored_entity_counts["EMAIL_ADDRESS"] == 2  # input + output
    assert record.input.storage is BodyStorage.REDACTED and record.input.encrypted
    assert record.idempotency_key == "idem-1" and record.contract_result == "not_declared"
    assert record.body_expires_at == pytest.approx(record.time + 30 * DAY_S)  # personal: 30 days


def test_record_says_which_bills_were_charged_at_the_bound(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder],
) -> None:
    """Found reading the stored record (stop 42): an attempt whose usage was never read (a
    stream cut off, a timeout) was charged the bound, but the stored record's attempts and
    bills said nothing of it, so its charge read as an overcharge of what the provider
    reported. Each attempt now says whether its usage was read, and each bill what it was
    charged at."""
    store, _, builder = parts
    timed_out = Attempt("openai", "gpt-4o-mini", "gpt-4o-mini-2024-07-18", 1.0, 900.0, billed_unknown=True)
    answered = Attempt("anthropic", "claude-haiku", "claude-3-5-haiku", 2.0, 300.0, usage=Usage(40, 12))
    bills = (Bill("gpt-4o-mini", Usage(40, 256), 160_000, "bound"), Bill("claude-haiku", Usage(40, 12), 80_000))
    store.append([builder.build(make_exchange(attempts=(timed_out, answered), bills=bills))])
    record = store.find()[0].entry
    assert isinstance(record, RequestRecord)
    assert [a.billed_unknown for a in record.attempts] == [True, False]
    assert [(b.model, b.completion_tokens, b.basis) for b in record.bills] == [
        ("gpt-4o-mini", 256, "bound"),
        ("claude-haiku", 12, "reported"),
    ]
    assert store.verify() == []


def test_a_schema_2_record_still_reads_and_says_it_does_not_know_its_bills_basis(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder],
) -> None:
    """Records already in a chain cannot change: one written before schema 3 parses as it was
    written, with nothing claimed about what its bills were charged at."""
    _, _, builder = parts
    bills = (Bill("gpt-4o-mini", Usage(40, 12), 80_000),)
    record = builder.build(make_exchange(bills=bills)).record
    old = record.model_dump(mode="json")
    old["schema_version"] = 2
    for attempt in old["attempts"]:
        del attempt["billed_unknown"]
    for bill in old["bills"]:
        del bill["basis"]
    parsed = parse_entry(json.dumps(old))  # as the chain holds it: the payload as written
    assert isinstance(parsed, RequestRecord) and parsed.schema_version == 2
    assert parsed.bills[0].basis is None and not parsed.attempts[0].billed_unknown


def test_hash_only_class_stores_no_body(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    [rid] = _fill(store, builder, 1, flow=make_flow(data_class="regulated"))
    record = store.find()[0].entry
    assert isinstance(record, RequestRecord)
    assert record.input.storage is BodyStorage.HASH and record.input.digest is not None
    assert record.input.digest.startswith("hmac-sha256:") and store.body(rid, "input") is None


def test_appending_a_request_twice_keeps_one_record(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    pending = builder.build(make_exchange())
    assert store.append([pending]) == 1
    assert store.append([pending]) == 0
    assert store.count() == 1 and store.verify() == []


def _tamper(store: AuditStore, sql: str, *args: object) -> None:
    """What someone with write access to the database does, behind the store's back."""
    with store.db.transaction() as tx:
        tx.execute(sql, args)


def test_an_edited_record_is_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    _fill(store, builder, 5)
    assert store.verify() == []
    _tamper(
        store, "UPDATE entries SET payload = replace(payload, '\"cost_usd\":0.0012', '\"cost_usd\":0.0') WHERE seq = 3"
    )
    [finding] = store.verify()
    assert (finding.seq, finding.problem) == (3, "edited")


def test_an_edited_record_with_recomputed_hash_breaks_the_next_link(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder],
) -> None:
    from switchyard.audit.chain import link_hash

    store, _, builder = parts
    _fill(store, builder, 4)
    rows = list(store.rows())
    forged = rows[1].payload.replace('"cost_usd":0.0012', '"cost_usd":0.0')
    _tamper(
        store, "UPDATE entries SET payload = ?, hash = ? WHERE seq = 2", forged, link_hash(rows[1].prev_hash, forged)
    )
    [finding] = store.verify()
    assert finding.seq == 3 and finding.problem == "broken_link"


def test_a_deleted_record_is_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    _fill(store, builder, 5)
    _tamper(store, "DELETE FROM entries WHERE seq = 2")
    findings = store.verify()
    assert [(f.seq, f.problem) for f in findings if f.problem != "body_edited"] == [(3, "deleted")]
    assert "2 are missing" in str(findings[0])


def test_reordered_records_are_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    _fill(store, builder, 5)
    rows = {r.seq: r for r in store.rows()}
    for seq, other in ((2, 3), (3, 2)):  # swap the two rows' contents, keeping their seq numbers
        r = rows[other]
        _tamper(
            store,
            "UPDATE entries SET request_id = ?, payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
            f"tmp-{seq}",
            r.payload,
            r.prev_hash,
            r.hash,
            seq,
        )
    problems = {(f.seq, f.problem) for f in store.verify()}
    assert (2, "reordered") in problems and (3, "reordered") in problems


def test_an_edited_body_is_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    [rid] = _fill(store, builder, 1)
    _tamper(store, "UPDATE bodies SET data = ? WHERE request_id = ? AND part = 'output'", b"\x00", rid)
    [finding] = store.verify()
    assert finding.problem == "body_edited" and "output" in finding.detail


def test_a_query_never_shows_an_edited_body_as_the_body(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder], data_policies: DataPolicies
) -> None:
    """Found reading the query path (stop 43): a body kept in clear (a schema-1 record's) was
    returned as written whatever its digest said, so an edit `audit verify` reports was shown
    to an auditor as the body, and bytes that are not UTF-8 raised out of the query."""
    store, keyring, builder = parts
    record = builder.build(make_exchange(flow=make_flow(data_class="internal"), user="u-old")).record
    legacy = record.model_copy(
        update={
            "schema_version": 1,
            "input": StoredBody(storage=BodyStorage.FULL, digest=plain_digest(EMAIL.encode())),
            "output": StoredBody(storage=BodyStorage.FULL, digest=plain_digest(b"kept as written")),
        }
    )
    store.append([PendingEntry(legacy, (BodyBlob("input", EMAIL.encode()), BodyBlob("output", b"kept as written")))])
    reader = AuditReader(store, keyring, data_policies)
    [view] = reader.query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    assert view["bodies"] == {"input": EMAIL, "output": "kept as written"}
    rid = record.request_id
    _tamper(store, "UPDATE bodies SET data = ? WHERE request_id = ? AND part = 'input'", b"forged", rid)
    _tamper(store, "UPDATE bodies SET data = ? WHERE request_id = ? AND part = 'output'", b"\xff\xfe", rid)
    [view] = [v for v in reader.query(AUDITOR, AuditQuery(team="support", with_bodies=True)) if v["kind"] == "request"]
    assert view["bodies"] == {part: "[edited: does not match the digest its record carries]" for part in view["bodies"]}
    assert {f.problem for f in store.verify()} == {"body_edited"}


def test_truncating_a_sealed_segment_is_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    _fill(store, builder, 4)
    store.seal_segments(size=4)
    _tamper(store, "DELETE FROM entries WHERE seq = 4")
    assert [f.problem for f in store.verify()] == ["truncated"]


def test_erasure_makes_bodies_unreadable_and_the_chain_still_verifies(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder],
    data_policies: DataPolicies,
) -> None:
    store, keyring, builder = parts
    _fill(store, builder, 2, user="u-erase")
    [kept] = _fill(store, builder, 1, user="u-keep")
    reader = AuditReader(store, keyring, data_policies)
    before = reader.query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    assert all("<EMAIL_ADDRESS>" in v["bodies"]["output"] for v in before)

    asyncio.run(erase_subject(store, keyring, "support", "u-erase", erased_by="aud1"))

    after = reader.query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    bodies = {v["request_id"]: v["bodies"] for v in after if v["kind"] == "request"}
    assert [b["input"] for rid, b in bodies.items() if rid != kept] == ["[erased]", "[erased]"]
    assert bodies[kept]["output"].startswith("We will email you at <EMAIL_ADDRESS>")
    assert store.verify() == []
    kinds = [e.entry.kind for e in store.find()]
    assert kinds.count("erasure") == 1 and kinds.count("access") == 2  # reads are audited too
    # A new request from the erased subject gets a fresh key and stays readable.
    [fresh] = _fill(store, builder, 1, user="u-erase")
    latest = reader.query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    assert next(v for v in latest if v["request_id"] == fresh)["bodies"]["input"] != "[erased]"


def test_the_erased_key_is_gone_from_the_key_file(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, keyring, builder = parts
    _fill(store, builder, 1, user="u-gone")
    key_id, key = keyring.key_for("support/u-gone")
    asyncio.run(erase_subject(store, keyring, "support", "u-gone", erased_by="aud1"))
    with pytest.raises(KeyErased):
        keyring.key_by_id(key_id)
    with keyring.db.read() as tx:
        assert [bytes(r[0]) for r in tx.execute("SELECT key FROM subject_keys").rows if bytes(r[0]) == key] == []
    if isinstance(keyring.db, SqliteDatabase):  # Postgres: the bound in subject_keys' docstring
        assert key not in keyring.db.path.read_bytes()


def test_retention_removes_bodies_and_keeps_records(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder], data_policies: DataPolicies
) -> None:
    store, keyring, builder = parts
    now = 1_800_000_000.0
    [old] = _fill(store, builder, 1, received_at=now - 31 * DAY_S)  # personal: 30 days
    [young] = _fill(store, builder, 1, received_at=now - 29 * DAY_S)
    [public] = _fill(
        store, builder, 1, received_at=now - 31 * DAY_S, flow=make_flow(data_class="public", retention_days=365)
    )
    assert store.purge_expired_bodies(now=now) == 2  # input and output of `old`
    assert store.body(old, "input") is None and store.body(young, "input") is not None
    assert store.body(public, "output") is not None
    assert store.count() == 3 and store.verify(now=now) == []
    view = AuditReader(store, keyring, data_policies).query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    assert next(v for v in view if v["request_id"] == old)["bodies"]["input"] == "[removed by retention]"


def test_deleting_a_body_before_its_retention_is_found(parts: tuple[AuditStore, SubjectKeyring, RecordBuilder]) -> None:
    store, _, builder = parts
    [rid] = _fill(store, builder, 1)
    _tamper(store, "DELETE FROM bodies WHERE request_id = ? AND part = 'input'", rid)
    assert [f.problem for f in store.verify()] == ["body_edited"]


def test_full_storage_keeps_the_text_sealed(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder], data_policies: DataPolicies
) -> None:
    store, keyring, builder = parts
    [rid] = _fill(store, builder, 1, flow=make_flow(data_class="internal"))
    body = store.body(rid, "input")
    assert body is not None and EMAIL.encode() not in body  # sealed under the subject's key
    [view] = AuditReader(store, keyring, data_policies).query(AUDITOR, AuditQuery(team="support", with_bodies=True))
    assert EMAIL in view["bodies"]["input"]  # internal: stored in full, by policy


def test_erasure_deletes_the_plaintext_bodies_of_schema_1_records(
    parts: tuple[AuditStore, SubjectKeyring, RecordBuilder],
) -> None:
    """Records written before schema 2 named the subject in clear and kept `internal` bodies
    unencrypted: erasure deletes those bodies, says so in its record, and verify accepts it."""
    store, keyring, builder = parts
    record = builder.build(make_exchange(flow=make_flow(data_class="internal"), user="u-old")).record
    rid = record.request_id
    legacy = record.model_copy(
        update={
            "schema_version": 1,
            "user": "u-old",
            "subject": "support/u-old",
            "input": record.input.model_copy(update={"encrypted": False, "key_id": None}),
        }
    )
    store.append([PendingEntry(legacy, (BodyBlob("input", EMAIL.encode()),))])  # in clear, as schema 1 kept it
    assert store.body(rid, "input") == EMAIL.encode()
    erasure = asyncio.run(erase_subject(store, keyring, "support", "u-old", erased_by="aud1"))
    assert erasure.bodies_removed == (rid,) and store.body(rid, "input") is None
    assert [f.problem for f in store.verify()] == []
