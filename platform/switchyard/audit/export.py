"""Export of sealed segments to S3 (boto3), with object-lock retention where the bucket has it,
and the check of the database against those copies.

A segment object holds the chain entries (payloads and hashes), never bodies: a locked
object cannot be deleted before its retain-until date, so it must hold nothing that
retention or erasure would have to remove. Bodies stay in SQLite, under those rules; user
ids are pseudonyms in the payloads (`subject_keys.pseudonym`).

Each export also writes the chain head as it is then (`head-<seq>.json`, locked too), so
entries not yet sealed into a segment are anchored off the host as well. `verify_export`
reads every segment and head back and reports where the database disagrees.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from switchyard.audit.anchors import Anchor, check_anchors
from switchyard.audit.chain import ChainRow, Finding
from switchyard.audit.store import AuditStore, Segment, distinct

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class S3Target:
    bucket: str
    prefix: str = "audit/"
    retention_days: int = 365  # object-lock retain-until = upload time + this
    lock_mode: str = "COMPLIANCE"  # COMPLIANCE: nobody, root included, can shorten it


def segment_key(target: S3Target, seg: Segment) -> str:
    return f"{target.prefix}segment-{seg.segment_no:08d}-{seg.first_seq}-{seg.last_seq}.jsonl"


def head_key(target: S3Target, seq: int) -> str:
    return f"{target.prefix}head-{seq:012d}.json"


_SEGMENT_KEY = re.compile(r"segment-(\d+)-(\d+)-(\d+)\.jsonl")
_HEAD_KEY = re.compile(r"head-(\d+)\.json")


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
        key = segment_key(target, seg)
        metadata = {"first-seq": str(seg.first_seq), "last-seq": str(seg.last_seq), "last-hash": seg.last_hash}
        _put(client, target, locked, key, segment_body(store, seg), "application/x-ndjson", metadata)
        store.mark_exported(seg.segment_no, f"s3://{target.bucket}/{key}")
        written.append(key)
    seq, digest = store.head()
    if seq and not _exists(client, target.bucket, head_key(target, seq)):
        body = Anchor(seq, digest, datetime.now(UTC).timestamp()).line().encode()
        _put(client, target, locked, head_key(target, seq), body, "application/json", {})
        written.append(head_key(target, seq))
    return written


def _put(
    client: Any, target: S3Target, locked: bool, key: str, body: bytes, content_type: str, metadata: dict[str, str]
) -> None:
    extra: dict[str, Any] = {
        "Metadata": metadata,
        "ChecksumAlgorithm": "SHA256",  # S3 rejects locked puts without a checksum header
    }
    if locked:
        extra["ObjectLockMode"] = target.lock_mode
        extra["ObjectLockRetainUntilDate"] = datetime.now(UTC) + timedelta(days=target.retention_days)
    client.put_object(Bucket=target.bucket, Key=key, Body=body, ContentType=content_type, **extra)


def _exists(client: Any, bucket: str, key: str) -> bool:
    try:
        client.head_object(Bucket=bucket, Key=key)
    except client.exceptions.ClientError as exc:
        if exc.response.get("Error", {}).get("Code", "") in ("404", "NoSuchKey", "NotFound"):
            return False
        raise
    return True


def _objects(client: Any, target: S3Target) -> Iterator[tuple[str, float]]:
    """(key, last modified) of every object under the prefix."""
    for page in client.get_paginator("list_objects_v2").paginate(Bucket=target.bucket, Prefix=target.prefix):
        for obj in page.get("Contents", []):
            yield str(obj["Key"]), obj["LastModified"].timestamp()


def _read(client: Any, bucket: str, key: str) -> str:
    return str(client.get_object(Bucket=bucket, Key=key)["Body"].read().decode())


def verify_export(store: AuditStore, client: Any, target: S3Target) -> list[Finding]:
    """The database against its S3 copies: every exported entry is in the database unchanged,
    every exported segment has its row, every row marked exported has its object, and every
    exported head is still in the chain. An empty list means they agree."""
    rows = {r.seq: r for r in store.rows()}
    segments = {seg.segment_no: seg for seg in store.segments()}
    where = f"in s3://{target.bucket}/{target.prefix}"
    findings: list[Finding] = []
    heads: list[Anchor] = []
    exported: set[int] = set()
    for key, modified in _objects(client, target):
        name = key[len(target.prefix) :]
        if (m := _SEGMENT_KEY.fullmatch(name)) is not None:
            number, last_seq = int(m[1]), int(m[3])
            exported.add(number)
            copies = [_exported_row(line) for line in _read(client, target.bucket, key).splitlines() if line]
            findings += _compare_segment(copies, rows, key)
            heads.append(Anchor(last_seq, copies[-1].hash if copies else "", modified, number))
        elif (m := _HEAD_KEY.fullmatch(name)) is not None:
            try:
                heads.append(Anchor.parse(_read(client, target.bucket, key)))
            except (ValueError, KeyError, TypeError):
                findings.append(Finding(int(m[1]), "s3_mismatch", f"the head object {key} is not an anchor"))
    by_no = {n: (seg.last_seq, seg.last_hash) for n, seg in segments.items()}
    findings += check_anchors(heads, rows, by_no, where, mismatch="s3_mismatch")
    for seg in segments.values():
        if seg.exported_to is not None and seg.segment_no not in exported:
            findings.append(Finding(seg.last_seq, "s3_mismatch", f"segment {seg.segment_no}'s S3 copy is gone {where}"))
    return distinct(findings)


def _exported_row(line: str) -> ChainRow:
    d = json.loads(line)
    payload = json.dumps(d["payload"], sort_keys=True, separators=(",", ":"))
    return ChainRow(int(d["seq"]), payload, str(d["prev_hash"]), str(d["hash"]))


def _compare_segment(copies: list[ChainRow], rows: dict[int, ChainRow], key: str) -> list[Finding]:
    findings = []
    for copy in copies:
        row = rows.get(copy.seq)
        if row is None:
            findings.append(Finding(copy.seq, "s3_mismatch", f"in the S3 copy {key} but not in the database"))
        elif row != copy:
            findings.append(Finding(copy.seq, "s3_mismatch", f"differs from its S3 copy {key}"))
    return findings
