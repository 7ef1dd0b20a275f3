"""Export of sealed segments to S3 (boto3), with object-lock retention where the bucket has it.

A segment object holds the chain entries (payloads and hashes), never bodies: a locked
object cannot be deleted before its retain-until date, so it must hold nothing that
retention or erasure would have to remove. Bodies stay in SQLite, under those rules.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from switchyard.audit.store import AuditStore, Segment

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class S3Target:
    bucket: str
    prefix: str = "audit/"
    retention_days: int = 365  # object-lock retain-until = upload time + this
    lock_mode: str = "COMPLIANCE"  # COMPLIANCE: nobody, root included, can shorten it


def segment_key(target: S3Target, seg: Segment) -> str:
    return f"{target.prefix}segment-{seg.segment_no:08d}-{seg.first_seq}-{seg.last_seq}.jsonl"


def segment_body(store: AuditStore, seg: Segment) -> bytes:
    lines = [
        json.dumps(
            {
                "seq": r.seq,
                "prev_hash": r.prev_hash,
                "hash": r.hash,
                "payload": json.loads(r.payload),
            },
            sort_keys=True,
            separators=(",", ":"),
        )
        for r in store.segment_rows(seg)
    ]
    return ("\n".join(lines) + "\n").encode()


def bucket_has_object_lock(client: Any, bucket: str) -> bool:
    try:
        conf = client.get_object_lock_configuration(Bucket=bucket)
    except client.exceptions.ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "")
        if code == "ObjectLockConfigurationNotFoundError":
            return False
        raise
    return bool(conf.get("ObjectLockConfiguration", {}).get("ObjectLockEnabled") == "Enabled")


def export_sealed(store: AuditStore, client: Any, target: S3Target) -> list[str]:
    """Upload every sealed, not yet exported segment; returns the object keys written."""
    locked = bucket_has_object_lock(client, target.bucket)
    if not locked:
        log.warning("bucket %s has no object lock: exported segments can be deleted", target.bucket)
    written = []
    for seg in store.segments(unexported_only=True):
        body = segment_body(store, seg)
        key = segment_key(target, seg)
        extra: dict[str, Any] = {
            "Metadata": {
                "first-seq": str(seg.first_seq),
                "last-seq": str(seg.last_seq),
                "last-hash": seg.last_hash,
            },
            "ChecksumAlgorithm": "SHA256",  # S3 rejects locked puts without a checksum header
        }
        if locked:
            extra["ObjectLockMode"] = target.lock_mode
            extra["ObjectLockRetainUntilDate"] = datetime.now(UTC) + timedelta(days=target.retention_days)
        client.put_object(Bucket=target.bucket, Key=key, Body=body, ContentType="application/x-ndjson", **extra)
        store.mark_exported(seg.segment_no, f"s3://{target.bucket}/{key}")
        written.append(key)
    return written
