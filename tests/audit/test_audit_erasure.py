"""Erasure leaves nothing of the subject readable or linkable (issue 15, finding 9).

Bodies of every class, encrypted or not by policy, are sealed under the subject's key; user
and subject reach the chain, the S3 copies and the key file only as pseudonyms under that
key; stored idempotent answers of the subject are purged. On SQLite and on Postgres.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from _audit_helpers import EMAIL, make_exchange, make_flow

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.erasure import erase_subject
from switchyard.audit.export import S3Target, export_sealed
from switchyard.audit.query import AuditQuery, AuditReader
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.cli import main
from switchyard.db.location import Store, open_store
from switchyard.gateway.idempotency import InMemoryIdempotencyStore, StoredResponse, body_fingerprint
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore, Principal
from switchyard.policy.models import DataPolicies, Role

USER = "u-erasable-7731"  # distinctive, so a search for it finds nothing else
AUDITOR = Principal("au", PLATFORM_TEAM, Role.AUDITOR)


@pytest.fixture
def state(audit_state: Path) -> Path:
    return audit_state


def _builder(state: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> RecordBuilder:
    return RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(state))


def _erase_with_cli(state: Path, capsys: pytest.CaptureFixture[str], user: str) -> None:
    key, _ = KeyStore.in_state_dir(state).create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)
    code = main(["audit", "erase", "--team", "support", "--subject", user, "--state-dir", str(state), "--api-key", key])
    out = capsys.readouterr()
    assert code == 0, out.out + out.err


def _stored(state: Path) -> dict[str, bytes]:
    """Every byte the audit keeps: the files under `<state>/audit/` and, on Postgres, the rows
    of the audit and key tables (the database's files are the server's)."""
    found = {str(p): p.read_bytes() for p in (state / "audit").rglob("*") if p.is_file()}
    db = open_store(state, Store.AUDIT)
    try:
        if db.dialect == "postgres":
            with db.read() as tx:
                for table in ("entries", "bodies", "segments", "subject_keys", "erasures"):
                    found[f"table {table}"] = b"\n".join(map(_row_bytes, tx.execute(f"SELECT * FROM {table}").rows))
    finally:
        db.close()
    return found


def _row_bytes(row: tuple[Any, ...]) -> bytes:
    return b"\t".join(bytes(v) if isinstance(v, bytes | memoryview) else str(v).encode() for v in row)


def test_an_internal_class_body_is_unreadable_after_erasure(
    state: Path, data_policies: DataPolicies, scrubber: TextScrubber, capsys: pytest.CaptureFixture[str]
) -> None:
    store = AuditStore.in_state_dir(state)
    internal = make_flow(flow="triage", data_class="internal")  # the org default: stored in full
    exchange = make_exchange(flow=internal, user=USER)
    store.append([_builder(state, data_policies, scrubber).build(exchange)])
    store.close()

    _erase_with_cli(state, capsys, USER)

    store = AuditStore.in_state_dir(state)
    rid = exchange.ctx.request_id
    for part in ("input", "output"):
        stored = store.body(rid, part)
        assert stored is None or EMAIL.encode() not in stored, f"the {part} body is still readable"
    reader = AuditReader(store, SubjectKeyring.in_state_dir(state), data_policies)
    [view] = [v for v in reader.query(AUDITOR, AuditQuery("support", with_bodies=True)) if v["kind"] == "request"]
    assert view["bodies"] == {"input": "[erased]", "output": "[erased]"}
    assert not [path for path, blob in _stored(state).items() if EMAIL.encode() in blob]
    assert store.verify() == []


def test_the_user_id_is_in_no_chain_entry_export_or_key_file(
    state: Path,
    backend: str,
    data_policies: DataPolicies,
    scrubber: TextScrubber,
    s3: Any,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = AuditStore.in_state_dir(state)
    builder = _builder(state, data_policies, scrubber)
    store.append([builder.build(make_exchange(user=USER)) for _ in range(3)])
    store.append([builder.build(make_exchange(user="u-other"))])
    store.seal_segments(size=2, include_partial=True)
    bucket = f"erasure-export-{backend}"  # one moto server serves both backends' runs
    s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    export_sealed(store, s3, S3Target(bucket))
    store.close()

    _erase_with_cli(state, capsys, USER)

    store = AuditStore.in_state_dir(state)
    payloads = [r.payload for r in store.rows()]
    assert len(payloads) == 5 and json.loads(payloads[-1])["kind"] == "erasure"
    assert not [p for p in payloads if USER in p], "the user id is in the chain in clear"
    listed = s3.list_objects_v2(Bucket=bucket)["Contents"]
    exported = [s3.get_object(Bucket=bucket, Key=o["Key"])["Body"].read() for o in listed]
    assert exported and not [b for b in exported if USER.encode() in b], "the user id is in an S3 copy"
    assert not [path for path, blob in _stored(state).items() if USER.encode() in blob]
    # The subject's records still link up with each other (one pseudonym), not with others.
    users = [json.loads(p).get("user") for p in payloads[:4]]
    assert users[0] == users[1] == users[2] != users[3]
    assert store.verify() == []


def test_an_erased_subjects_idempotent_replay_no_longer_returns_the_stored_answer(
    state: Path, data_policies: DataPolicies
) -> None:
    store = AuditStore.in_state_dir(state)
    keyring = SubjectKeyring.in_state_dir(state)
    replays = InMemoryIdempotencyStore()
    body_hash = body_fingerprint("reply", b'{"messages": "..."}')
    answer = StoredResponse(200, {"answer": f"we wrote to {EMAIL}"}, {}, subject=keyring.pseudonym_for("support", USER))
    other = StoredResponse(200, {"answer": "kept"}, {}, subject=keyring.pseudonym_for("support", "u-other"))

    async def scenario() -> None:
        for key, response in (("idem-erased", answer), ("idem-kept", other)):
            assert (await replays.claim("support", key, body_hash)).outcome == "owner"
            await replays.complete("support", key, response)
        assert (await replays.claim("support", "idem-erased", body_hash)).response == answer

        await erase_subject(store, keyring, "support", USER, erased_by="pa1", idempotency=replays)

        retry = await replays.claim("support", "idem-erased", body_hash)
        assert retry.outcome == "owner" and retry.response is None  # runs again; nothing replayed
        assert (await replays.claim("support", "idem-kept", body_hash)).response == other

    asyncio.run(scenario())
    [erasure] = [e.entry for e in store.find() if e.entry.kind == "erasure"]
    assert erasure.model_dump()["replays_purged"] == 1


def test_an_answer_completed_after_the_erasure_is_not_stored(state: Path) -> None:
    """A request of the subject in flight during the erasure completes with the old pseudonym."""
    store = AuditStore.in_state_dir(state)
    keyring = SubjectKeyring.in_state_dir(state)
    replays = InMemoryIdempotencyStore()
    old_alias = keyring.pseudonym_for("support", USER)

    async def scenario() -> None:
        assert (await replays.claim("support", "idem-1", "h")).outcome == "owner"
        await erase_subject(store, keyring, "support", USER, erased_by="pa1", idempotency=replays)
        await replays.complete("support", "idem-1", StoredResponse(200, {"answer": "x"}, {}, subject=old_alias))
        assert (await replays.claim("support", "idem-1", "h")).outcome == "owner"

    asyncio.run(scenario())
    assert keyring.pseudonym_for("support", USER) != old_alias  # a new key, a new pseudonym


def test_erasing_the_team_key_covers_requests_that_named_no_user(
    state: Path, data_policies: DataPolicies, scrubber: TextScrubber, capsys: pytest.CaptureFixture[str]
) -> None:
    store = AuditStore.in_state_dir(state)
    builder = _builder(state, data_policies, scrubber)
    anonymous, named = make_exchange(user=None), make_exchange(user=USER)
    store.append([builder.build(anonymous), builder.build(named)])
    key, _ = KeyStore.in_state_dir(state).create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)
    code = main(["audit", "erase", "--team", "support", "--team-key", "--state-dir", str(state), "--api-key", key])
    assert code == 0, capsys.readouterr()
    reader = AuditReader(store, SubjectKeyring.in_state_dir(state), data_policies)
    views = {v["request_id"]: v for v in reader.query(AUDITOR, AuditQuery("support", with_bodies=True))}
    assert views[anonymous.ctx.request_id]["bodies"]["input"] == "[erased]"
    assert views[named.ctx.request_id]["bodies"]["input"] != "[erased]"
