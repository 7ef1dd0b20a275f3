"""The hash chain: each entry's hash covers the previous entry's hash and its own payload.

An edited payload changes its hash; a deleted entry leaves a link pointing at a hash that is
not its predecessor's; swapped entries point at each other. `verify` says which and where.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

GENESIS = "0" * 64


def link_hash(prev_hash: str, payload: str) -> str:
    return hashlib.sha256(f"{prev_hash}\n{payload}".encode()).hexdigest()


@dataclass(frozen=True)
class ChainRow:
    seq: int
    payload: str
    prev_hash: str
    hash: str


@dataclass(frozen=True)
class Finding:
    seq: int
    problem: Literal[
        "edited",
        "deleted",
        "reordered",
        "broken_link",
        "body_edited",
        "truncated",  # entries that a sealed segment or an anchored head had are gone
        "segment_deleted",  # a segment that an anchor or S3 knows was sealed has no row
        "anchor_mismatch",  # an entry or segment row differs from what anchors.jsonl recorded
        "s3_mismatch",  # the database and an S3 copy disagree
    ]
    detail: str

    def __str__(self) -> str:
        return f"seq {self.seq}: {self.problem}: {self.detail}"


def verify_rows(rows: Iterable[ChainRow]) -> list[Finding]:
    """Check every link of the chain, in seq order. An empty list means the chain is intact."""
    all_rows = list(rows)
    position = {r.hash: r.seq for r in all_rows}
    findings: list[Finding] = []
    prev_hash, prev_seq = GENESIS, 0
    for row in all_rows:
        if link_hash(row.prev_hash, row.payload) != row.hash:
            findings.append(Finding(row.seq, "edited", "the payload or its hash was changed"))
        if row.prev_hash != prev_hash:
            findings.append(_link_finding(row, prev_seq, position))
        prev_hash, prev_seq = row.hash, row.seq
    return findings


def _link_finding(row: ChainRow, prev_seq: int, position: dict[str, int]) -> Finding:
    if row.seq != prev_seq + 1:
        missing = f"{prev_seq + 1}" if row.seq == prev_seq + 2 else f"{prev_seq + 1}..{row.seq - 1}"
        return Finding(row.seq, "deleted", f"entries {missing} are missing before this one")
    owner = position.get(row.prev_hash)
    if owner is not None:
        return Finding(
            row.seq,
            "reordered",
            f"this entry was written after seq {owner}, not after seq {prev_seq}",
        )
    return Finding(
        row.seq,
        "broken_link",
        f"its predecessor is no longer in the chain (removed or replaced before seq {row.seq})",
    )
