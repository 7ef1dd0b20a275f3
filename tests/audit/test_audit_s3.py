"""Sealed segments exported to S3 (moto's server on 127.0.0.1), with object-lock headers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _audit_helpers import make_exchange

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.chain import ChainRow, verify_rows
from switchyard.audit.export import S3Target, export_sealed
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.policy.models import DataPolicies


@pytest.fixture
def store(tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> AuditStore:
    store = AuditStore.in_state_dir(tmp_path)
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path))
    store.append([builder.build(make_exchange()) for _ in range(7)])
    return store


def test_sealed_segments_go_to_a_locked_bucket(s3: Any, store: AuditStore) -> None:
    s3.create_bucket(Bucket="audit-locked", ObjectLockEnabledForBucket=True)
    assert [s.last_seq for s in store.seal_segments(size=3)] == [3, 6]  # 7th waits for a full segment
    *keys, head_key = export_sealed(store, s3, S3Target("audit-locked", retention_days=30))
    assert keys == ["audit/segment-00000001-1-3.jsonl", "audit/segment-00000002-4-6.jsonl"]
    head = s3.head_object(Bucket="audit-locked", Key=keys[0])
    assert head["ObjectLockMode"] == "COMPLIANCE" and head["ObjectLockRetainUntilDate"] is not None
    assert head["Metadata"]["last-seq"] == "3"
    # The chain head, unsealed 7th entry included, is anchored next to the segments, locked too.
    assert head_key == "audit/head-000000000007.json"
    anchor = json.loads(s3.get_object(Bucket="audit-locked", Key=head_key)["Body"].read())
    assert (anchor["seq"], anchor["hash"]) == store.head()
    assert s3.head_object(Bucket="audit-locked", Key=head_key)["ObjectLockMode"] == "COMPLIANCE"
    # The exported entries verify on their own, and link up across segments.
    rows = []
    for key in keys:
        body = s3.get_object(Bucket="audit-locked", Key=key)["Body"].read().decode()
        for line in body.splitlines():
            d = json.loads(line)
            payload = json.dumps(d["payload"], sort_keys=True, separators=(",", ":"))
            rows.append(ChainRow(d["seq"], payload, d["prev_hash"], d["hash"]))
    assert [r.seq for r in rows] == [1, 2, 3, 4, 5, 6] and verify_rows(rows) == []
    assert export_sealed(store, s3, S3Target("audit-locked")) == []  # nothing exported twice
    assert all(s.exported_to for s in store.segments())


def test_a_bucket_without_object_lock_still_gets_segments(
    s3: Any, store: AuditStore, caplog: pytest.LogCaptureFixture
) -> None:
    s3.create_bucket(Bucket="audit-plain")
    store.seal_segments(size=5, include_partial=True)
    keys = export_sealed(store, s3, S3Target("audit-plain", prefix="x/"))
    assert len(keys) == 3  # two segments and the head
    assert "ObjectLockMode" not in s3.head_object(Bucket="audit-plain", Key=keys[0])
    assert "no object lock" in caplog.text
