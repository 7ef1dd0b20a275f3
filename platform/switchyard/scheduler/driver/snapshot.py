"""The live scheduler's state as a versioned document: what a snapshot file holds.

`{"schema_version": N, "wal_seq": S, "taken_at": T, "state": ...}`: the whole `LiveState`
through the core's generic codec (`core.state_codec`), after write-ahead-log record S. A
document of an older schema version is migrated step by step (`MIGRATIONS`) or refused with a
message naming both versions; one from a newer version is refused (this code cannot know what
it added).

Version history: 1, the first JSON snapshot (before it: a pickle in `scheduler.db`, migrated
once by the actor); 2, node cordons (`LiveState.cordons`, and the core's holds for them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from switchyard.scheduler.core.state_codec import StateCodecError, decode_state, encode_state
from switchyard.scheduler.driver.state import LiveState

SCHEMA_VERSION = 2


def _cordons_added(doc: dict[str, Any]) -> dict[str, Any]:
    """1 -> 2: no node was cordoned then; the codec gives the state's missing `cordons` its
    default (none), and the core held nothing for a cordon."""
    return {**doc, "schema_version": 2}


# from-version -> a function rewriting a document of that version into the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _cordons_added}


class SnapshotVersionError(ValueError):
    """A snapshot this code version cannot read."""


@dataclass(frozen=True)
class Snapshot:
    state: LiveState
    wal_seq: int  # the last write-ahead-log record the state includes
    taken_at: float


def to_document(state: LiveState, wal_seq: int, taken_at: float) -> dict[str, Any]:
    return {"schema_version": SCHEMA_VERSION, "wal_seq": wal_seq, "taken_at": taken_at, "state": encode_state(state)}


def from_document(doc: dict[str, Any], source: str) -> Snapshot:
    """Raises SnapshotVersionError naming `source` (the file) and both versions."""
    version = doc.get("schema_version")
    if not isinstance(version, int):
        raise SnapshotVersionError(f"{source}: no schema_version; not a scheduler snapshot")
    if version > SCHEMA_VERSION:
        raise SnapshotVersionError(
            f"{source}: snapshot schema version {version} is newer than this code's {SCHEMA_VERSION}; "
            "run the version that wrote it"
        )
    while version < SCHEMA_VERSION:
        migrate = MIGRATIONS.get(version)
        if migrate is None:
            raise SnapshotVersionError(
                f"{source}: snapshot schema version {version} cannot be migrated to this code's "
                f"version {SCHEMA_VERSION} (no migration from {version})"
            )
        doc = migrate(doc)
        version = doc["schema_version"]
    try:
        state = decode_state(doc["state"])
    except (StateCodecError, KeyError) as exc:
        raise SnapshotVersionError(f"{source}: snapshot (schema version {version}) does not load: {exc}") from exc
    if not isinstance(state, LiveState):
        raise SnapshotVersionError(f"{source}: snapshot holds a {type(state).__name__}, not a LiveState")
    return Snapshot(state, int(doc["wal_seq"]), float(doc["taken_at"]))
