"""`audit verify` against deletions a valid chain prefix hides (issue 15, finding 10).

A chain cut at its tail, or cut together with the segment rows that sealed it, is still a
valid chain: only heads anchored outside the database (`anchors.jsonl`, the S3 export) can
show what was there. A database rewritten consistently, anchors included, disagrees with
its S3 copies. Every test runs on SQLite and on Postgres (`audit_state`); the tampering goes
through the database, as anyone with its credentials could.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest
from _audit_helpers import make_exchange

from switchyard.audit.builder import DAY_S, RecordBuilder
from switchyard.audit.chain import link_hash
from switchyard.audit.export import S3Target, export_sealed
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.cli import main
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore
from switchyard.policy.models import DataPolicies, Role
from tests.skewed_host import on_a_skewed_host


def _filled(state: Path, data_policies: DataPolicies, scrubber: TextScrubber, n: int) -> AuditStore:
    """`n` records appended one at a time, as requests arrive; the store closed and reopened."""
    store = AuditStore.in_state_dir(state)
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(state))
    for _ in range(n):
        store.append([builder.build(make_exchange())])
    return store


def _reopen(store: AuditStore, state: Path) -> AuditStore:
    store.close()
    return AuditStore.in_state_dir(state)


def _sql(store: AuditStore, sql: str, *args: object) -> None:
    with store.db.transaction() as tx:
        tx.execute(sql, args)


def test_deleting_the_newest_unsealed_entries_is_found(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    store = _reopen(_filled(audit_state, data_policies, scrubber, 5), audit_state)
    assert store.verify() == []
    _sql(store, "DELETE FROM entries WHERE seq >= 4")
    findings = store.verify()
    assert [(f.seq, f.problem) for f in findings] == [(5, "truncated")], findings
    assert "4..5" in findings[0].detail


def test_deleting_sealed_segments_with_their_rows_is_found(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    store = _filled(audit_state, data_policies, scrubber, 6)
    store.seal_segments(size=3)
    store = _reopen(store, audit_state)
    _sql(store, "DELETE FROM entries WHERE seq > 3")
    _sql(store, "DELETE FROM segments WHERE segment_no = 2")
    problems = {(f.seq, f.problem) for f in store.verify()}
    assert (6, "segment_deleted") in problems and (6, "truncated") in problems, problems


def _forge_from(store: AuditStore, seq: int) -> None:
    """Rewrite entry `seq` and re-link everything after it, segment rows and anchors too:
    the database and the state directory agree with themselves again."""
    rows = list(store.rows())
    rewritten: dict[str, str] = {}
    prev = rows[seq - 2].hash
    with store.db.transaction() as tx:
        for row in rows[seq - 1 :]:
            payload = row.payload.replace('"cost_usd":0.0012', '"cost_usd":0.0') if row.seq == seq else row.payload
            digest = link_hash(prev, payload)
            tx.execute(
                "UPDATE entries SET payload = ?, prev_hash = ?, hash = ? WHERE seq = ?",
                (payload, prev, digest, row.seq),
            )
            tx.execute("UPDATE segments SET last_hash = ? WHERE last_seq = ?", (digest, row.seq))
            rewritten[row.hash] = digest
            prev = digest
    anchors = store.anchors.path
    if anchors.exists():
        text = anchors.read_text()
        for old, new in rewritten.items():
            text = text.replace(old, new)
        anchors.write_text(text)


def _verify_cli(state: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    key, _ = KeyStore.in_state_dir(state).create(PLATFORM_TEAM, Role.AUDITOR)
    code = main(["audit", "verify", "--json", "--state-dir", str(state), "--api-key", key, *argv])
    return code, json.loads(capsys.readouterr().out)


def test_a_database_that_disagrees_with_its_s3_copies_is_found(
    audit_state: Path,
    backend: str,
    data_policies: DataPolicies,
    scrubber: TextScrubber,
    s3: Any,
    s3_endpoint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = _filled(audit_state, data_policies, scrubber, 6)
    store.seal_segments(size=3)
    bucket = f"tamper-export-{backend}"  # one moto server serves both backends' runs
    s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    export_sealed(store, s3, S3Target(bucket))
    store = _reopen(store, audit_state)
    _forge_from(store, 5)
    assert store.verify() == []  # consistent on the host: only the off-host copy can tell

    code, report = _verify_cli(audit_state, capsys, "--bucket", bucket, "--endpoint-url", s3_endpoint)
    assert code == 1
    problems = {(f["seq"], f["problem"]) for f in report["findings"]}
    assert (5, "s3_mismatch") in problems and (6, "s3_mismatch") in problems, problems


def test_an_exported_segment_deleted_with_its_rows_and_anchors_is_found_against_s3(
    audit_state: Path,
    backend: str,
    data_policies: DataPolicies,
    scrubber: TextScrubber,
    s3: Any,
    s3_endpoint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = _filled(audit_state, data_policies, scrubber, 6)
    store.seal_segments(size=3)
    bucket = f"tamper-deleted-{backend}"  # one moto server serves both backends' runs
    s3.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
    export_sealed(store, s3, S3Target(bucket))
    store = _reopen(store, audit_state)
    _sql(store, "DELETE FROM entries WHERE seq > 3")
    _sql(store, "DELETE FROM segments WHERE segment_no = 2")
    anchors = store.anchors.path
    if anchors.exists():
        kept = [line for line in anchors.read_text().splitlines() if json.loads(line)["seq"] <= 3]
        anchors.write_text("".join(f"{line}\n" for line in kept))
    assert store.verify() == []

    code, report = _verify_cli(audit_state, capsys, "--bucket", bucket, "--endpoint-url", s3_endpoint)
    assert code == 1
    problems = {(f["seq"], f["problem"]) for f in report["findings"]}
    assert (6, "segment_deleted") in problems and (6, "truncated") in problems, problems


def test_an_untouched_export_verifies(
    audit_state: Path,
    backend: str,
    data_policies: DataPolicies,
    scrubber: TextScrubber,
    s3: Any,
    s3_endpoint: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    store = _filled(audit_state, data_policies, scrubber, 7)
    store.seal_segments(size=3)
    bucket = f"tamper-none-{backend}"  # one moto server serves both backends' runs
    s3.create_bucket(Bucket=bucket)
    export_sealed(store, s3, S3Target(bucket))
    store.close()  # the 7th entry is unsealed: the exported head anchors it all the same
    code, report = _verify_cli(audit_state, capsys, "--bucket", bucket, "--endpoint-url", s3_endpoint)
    assert (code, report["findings"]) == (0, [])


def test_a_payload_that_is_not_an_entry_is_a_finding_and_a_clear_error(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber, capsys: pytest.CaptureFixture[str]
) -> None:
    """Found by the generated tampering (stop 43): a payload edited into something that is not
    an entry (not JSON, or a record missing its fields) made `audit verify`, the command that
    is there to find edits, fail with "Expecting value: line 1 column 1 (char 0)", and every
    `audit query` with it. Now verify reports the entry, and a query names it."""
    store = _filled(audit_state, data_policies, scrubber, 3)
    _sql(store, "UPDATE entries SET payload = ? WHERE seq = 2", '{"kind": "request"}')
    store.close()
    code, report = _verify_cli(audit_state, capsys)
    assert code == 1
    assert [(f["seq"], f["problem"]) for f in report["findings"]] == [(2, "edited")], report

    admin = KeyStore.in_state_dir(audit_state).create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)[0]
    code = main(["audit", "query", "--state-dir", str(audit_state), "--api-key", admin])
    err = capsys.readouterr().err
    assert code != 0 and "audit entry 2 is not an audit entry" in err and "Traceback" not in err, err


def test_a_column_that_disagrees_with_its_entry_is_found(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    """Found by the generated tampering (stop 43): `team`, `flow`, `time` and `request_id` are
    copied out of each entry for queries, and verify never compared them with it. An entry
    moved to another team by its column vanished from its team's queries, and verify passed."""
    store = _reopen(_filled(audit_state, data_policies, scrubber, 3), audit_state)
    _sql(store, "UPDATE entries SET team = 'elsewhere' WHERE seq = 2")
    assert store.find(team="support", limit=10)[1].seq == 3  # hidden from its team's queries
    [finding] = store.verify()
    assert (finding.seq, finding.problem) == (2, "edited") and "team column says 'elsewhere'" in finding.detail


def test_an_anchor_the_disk_cut_short_leaves_no_false_alarm(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found reading the anchor log (stop 44): `write`'s count was not looked at, so a short
    write (a full disk) left a fragment that the next anchor extended into one line that is no
    anchor, and `audit verify` reported the file as edited from then on (and that anchor was
    lost). Now the fragment is cut under the file's lock and the failure logged."""
    real_write, cut = os.write, [True]

    def full_disk(fd: int, data: bytes) -> int:
        if cut and data.startswith(b'{"hash"'):
            cut.clear()
            return real_write(fd, data[: len(data) // 2])
        return real_write(fd, data)

    store = AuditStore.in_state_dir(audit_state, anchor_every_s=0)
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(audit_state))
    with monkeypatch.context() as patched:  # (`undo` would also drop the fixture's database)
        patched.setattr(os, "write", full_disk)
        for _ in range(2):
            store.append([builder.build(make_exchange())])
    assert not cut, "no anchor was written"
    anchors, unreadable = store.anchors.read()
    assert unreadable == [] and anchors[-1].seq == 2, (anchors, unreadable)
    assert _reopen(store, audit_state).verify() == []


_CLI = "import sys\nfrom switchyard.cli import main\nsys.exit(main(sys.argv[1:]))\n"


def test_a_purge_on_a_host_whose_clock_runs_ahead_keeps_bodies_inside_their_retention(
    audit_state: Path, data_policies: DataPolicies, scrubber: TextScrubber
) -> None:
    """Stop 48: `switchyard audit purge` (cron), and every gateway replica's retention task,
    deleted the bodies whose retention had ended by the clock of the host it ran on. On a host
    2 days ahead it deleted a body with a day of its 30 left, and `audit verify` on a host
    whose clock is right reported it as tampering ("deleted before its retention ended").
    Both now go by the database's clock."""
    store = AuditStore.in_state_dir(audit_state)
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(audit_state))
    exchange = make_exchange(received_at=time.time() - 29 * DAY_S)  # personal data: kept 30 days
    store.append([builder.build(exchange)])
    key, _ = KeyStore.in_state_dir(audit_state).create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)
    purge = ["audit", "purge", "--json", "--state-dir", str(audit_state), "--api-key", key]
    assert json.loads(on_a_skewed_host(2 * DAY_S, _CLI, *purge)) == {"bodies_removed": 0}
    assert store.body(exchange.ctx.request_id, "input") is not None
    assert store.verify() == []
