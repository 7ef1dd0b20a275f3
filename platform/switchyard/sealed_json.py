"""JSON documents that carry their own checksum, for the files the platform appends to and
reads back after a crash (the scheduler's write-ahead log, the charge journal).

A sealed document ends with `"crc32": N`, the CRC-32 of the compact JSON written before that
field (the document without it). A byte changed after the write that still parses (a digit of
an amount, a name) would otherwise be read back as another value; with the checksum the reader
knows the line was changed. CRC-32, not a cryptographic hash: this finds damage, not forgery
(the audit chain is what resists an editor). A reader keeps the lines that fail aside, as they
were, in `<file>.unreadable` (`keep_aside`) before it deletes the file it has read.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any

CHECKSUM = "crc32"
UNREADABLE = ".unreadable"  # `<file>.unreadable`: lines of `<file>` that were no whole entry, as they were

Document = dict[str, Any]


def sealed(document: Document, *, allow_nan: bool = False) -> bytes:
    """`document` as compact JSON, ending with its checksum field. `allow_nan`: the document
    holds infinities (JSON's `Infinity`, as a scheduler snapshot does)."""
    body = json.dumps(document, separators=(",", ":"), allow_nan=allow_nan).encode()
    return body[:-1] + b',"' + CHECKSUM.encode() + b'":' + str(zlib.crc32(body)).encode() + b"}"


def unsealed(document: Document) -> tuple[Document, bool]:
    """`document` without its checksum, and whether it had one; raises ValueError if the
    checksum does not match (a change after the write)."""
    if CHECKSUM not in document:
        return document, False
    rest = {k: v for k, v in document.items() if k != CHECKSUM}
    written = document[CHECKSUM]
    actual = zlib.crc32(json.dumps(rest, separators=(",", ":")).encode())
    if written != actual:
        raise ValueError(
            f"its checksum does not match (crc32 {written} written, {actual} read): changed after it was written"
        )
    return rest, True


_MARK = b',"' + CHECKSUM.encode() + b'":'


def sealed_bytes(body: bytes) -> bytes:
    """`body` (the compact JSON of an object, as written) with its checksum field added, for a
    writer that builds its JSON text itself: checked byte for byte, never encoded again."""
    return body[:-1] + _MARK + str(zlib.crc32(body)).encode() + b"}"


def unsealed_bytes(line: bytes) -> tuple[bytes, bool]:
    """The bytes `sealed_bytes` was given, and whether `line` had a checksum; raises ValueError
    if it does not match. (A JSON string escapes its quotes, so the checksum's `,"crc32":` is
    found only where `sealed_bytes` put it.)"""
    at = line.rfind(_MARK)
    if at < 0:
        return line, False
    written, body = line[at + len(_MARK) : -1], line[:at] + b"}"
    if not line.endswith(b"}") or not written.isdigit() or int(written) != zlib.crc32(body):
        raise ValueError(f"its checksum does not match ({written[:12]!r} written): changed after it was written")
    return body, True


def has_checksums(content: bytes) -> bool:
    """Whether a file of such lines was written with checksums: then a line without one was changed."""
    return _MARK in content


def keep_aside(path: Path, unreadable: list[bytes]) -> None:
    """Before `path` is deleted: its lines that were no whole entry, as they were, appended to
    `<path>.unreadable` and fsynced, for an operator."""
    if unreadable:
        with open(path.with_name(path.name + UNREADABLE), "ab") as f:
            f.write(b"".join(raw + b"\n" for raw in unreadable))
            os.fsync(f.fileno())
