"""The live scheduler's state as a versioned document: what a snapshot file holds.

`{"schema_version": N, "wal_seq": S, "taken_at": T, "state": ...}`: the whole `LiveState`
through the core's generic codec (`core.state_codec`), after write-ahead-log record S. A
document of an older schema version is migrated step by step (`MIGRATIONS`) or refused with a
message naming both versions; one from a newer version is refused (this code cannot know what
it added).

Version history: 1, the first JSON snapshot (before it: a pickle in `scheduler.db`, migrated
once by the actor); 2, node cordons (`LiveState.cordons`, and the core's holds for them); 3, one
preemption-notice type (`LiveState.notices` holds `preemption_channel.PreemptionNotice`s, which
the job's channel carries too, where it held the api's `Notice` models); 4, the core's holds
as one object (`core.holds.Holds` in `Scheduler._holds`, where they were eight fields of the
core); 5, the node pool knows its cordoned nodes (`NodePool._cordoned`), so that a cordon
takes no room from the rest of its node group; 6, the core counts the GPUs of running
non-preemptible leases per node (`Scheduler._unpreemptible`), which a reservation treats as
held.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from switchyard.scheduler.core.state_codec import StateCodecError, decode_state, encode_state
from switchyard.scheduler.driver.state import LiveState

SCHEMA_VERSION = 6


def _cordons_added(doc: dict[str, Any]) -> dict[str, Any]:
    """1 -> 2: no node was cordoned then; the codec gives the state's missing `cordons` its
    default (none), and the core held nothing for a cordon."""
    return {**doc, "schema_version": 2}


def _entries(root: Any) -> Iterator[dict[str, Any]]:
    """Every entry of an encoded state (see `core.state_codec`), not looking inside a pydantic
    model's fields (plain JSON, some of it a user's, such as a runtime env)."""
    stack = [root]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(item)
        elif isinstance(item, dict):
            yield item
            if item.get("t") == "obj":
                stack.extend(item["v"].values())
            elif item.get("t") != "model":
                stack.append(item.get("v"))


_V2_NOTICE = "switchyard.scheduler.api:Notice"
_V3_NOTICE = "switchyard.scheduler.preemption_channel:PreemptionNotice"
_LEASE = "switchyard.scheduler.core.model:Lease"


def _one_notice_type(doc: dict[str, Any]) -> dict[str, Any]:
    """2 -> 3: a notice was the api's `Notice` model (workload_id, lease_id, reason,
    stop_deadline), written as a model; it is a `PreemptionNotice` object now, under a new
    object id. It was sent when the core put its lease under notice (the lease's `notice_at`, set
    in the same call); without that lease, the snapshot's time stands in (it was sent by then)."""
    doc = copy.deepcopy(doc)
    entries = list(_entries(doc["state"]))
    next_id = 1 + max((e["#"] for e in entries if isinstance(e.get("#"), int)), default=-1)
    notice_at = {
        e["v"].get("lease_id"): e["v"].get("notice_at") for e in entries if e.get("t") == "obj" and e["c"] == _LEASE
    }
    for e in entries:
        if e.get("t") != "model" or e.get("c") != _V2_NOTICE:
            continue
        old = e["v"]
        sent_at = notice_at.get(old["lease_id"])
        fields = {
            "job_id": old["workload_id"],
            "reason": old["reason"],
            "deadline": old["stop_deadline"],
            "sent_at": float(doc["taken_at"] if sent_at is None else sent_at),
            "lease_id": old["lease_id"],
        }
        e.clear()
        e.update({"t": "obj", "c": _V3_NOTICE, "#": next_id, "v": fields})
        next_id += 1
    return {**doc, "schema_version": 3}


_SCHEDULER = "switchyard.scheduler.core.scheduler:Scheduler"
_HOLDS = "switchyard.scheduler.core.holds:Holds"
_HOLD_FIELDS = {  # version 3's field of the core -> version 4's field of its Holds
    "_reserved": "_amounts",
    "_reserved_value": "_value",
    "_hold_kind": "_kind",
    "_hold_team": "_team",
    "_hold_counts": "counts",
    "_waived_cache": "_waived_cache",
    "_held": "per_node",
    "_held_free": "_held_free",
}


def _holds_own_object(doc: dict[str, Any]) -> dict[str, Any]:
    """3 -> 4: the core's eight hold fields become one `Holds` object, written where the first
    of them was (so anything after it that refers back to them finds them decoded), sharing
    the core's node pool."""
    doc = copy.deepcopy(doc)
    entries = list(_entries(doc["state"]))
    next_id = 1 + max((e["#"] for e in entries if isinstance(e.get("#"), int)), default=-1)
    for e in entries:
        if e.get("t") != "obj" or e.get("c") != _SCHEDULER:
            continue
        old = e["v"]
        pool = old["_pool"]
        fields = {"_pool": {"@": pool["#"]} if "#" in pool else pool}
        fields.update({new: old[name] for name, new in _HOLD_FIELDS.items()})
        v: dict[str, Any] = {}
        for name, value in old.items():
            if name not in _HOLD_FIELDS:
                v[name] = value
            elif "_holds" not in v:
                v["_holds"] = {"t": "obj", "c": _HOLDS, "#": next_id, "v": fields}
                next_id += 1
        e["v"] = v
    return {**doc, "schema_version": 4}


_LIVE_STATE = "switchyard.scheduler.driver.state:LiveState"
_POOL = "switchyard.scheduler.core.placement:NodePool"


def _pool_knows_cordons(doc: dict[str, Any]) -> dict[str, Any]:
    """4 -> 5: the pool marks each cordoned node it has (the state's `cordons` that are among
    its nodes: a cordoned node away from the cluster is not in the pool)."""
    doc = copy.deepcopy(doc)
    entries = list(_entries(doc["state"]))
    next_id = 1 + max((e["#"] for e in entries if isinstance(e.get("#"), int)), default=-1)
    cordoned: set[str] = set()
    for e in entries:
        if e.get("t") == "obj" and e.get("c") == _LIVE_STATE and "cordons" in e["v"]:  # absent before 2
            cordoned.update(key for key, _ in e["v"]["cordons"]["v"])
    for e in entries:
        if e.get("t") == "obj" and e.get("c") == _POOL:
            in_pool = sorted(cordoned.intersection(key for key, _ in e["v"]["_nodes"]["v"]))
            e["v"]["_cordoned"] = {"t": "set", "#": next_id, "v": in_pool}
            next_id += 1
    return {**doc, "schema_version": 5}


def _unpreemptible_counted(doc: dict[str, Any]) -> dict[str, Any]:
    """5 -> 6: the core's GPUs of running non-preemptible leases per node, counted from its
    running leases (`_running`) and priority classes, and written where the core keeps the
    field (after `_running`, so object ids come out as this version numbers them)."""
    doc = copy.deepcopy(doc)
    entries = list(_entries(doc["state"]))
    by_id = {e["#"]: e for e in entries if isinstance(e.get("#"), int)}
    next_id = 1 + max(by_id, default=-1)

    def deref(node: dict[str, Any]) -> dict[str, Any]:
        return by_id[node["@"]] if "@" in node else node

    for e in entries:
        if e.get("t") != "obj" or e.get("c") != _SCHEDULER:
            continue
        old = e["v"]
        preemptible = {name: deref(cls)["v"]["preemptible"] for name, cls in deref(old["_priority"])["v"]}
        gpus_on: dict[str, int] = {}
        for _, leases in deref(old["_running"])["v"]:
            for _, ref in deref(leases)["v"]:
                lease = deref(ref)["v"]
                request = deref(lease["request"])["v"]
                if preemptible[request["priority_class"]]:
                    continue
                for node, gpus in zip(lease["placement"]["v"], request["bundles"]["v"], strict=True):
                    gpus_on[node] = gpus_on.get(node, 0) + gpus
        v: dict[str, Any] = {}
        for name, value in old.items():
            v[name] = value
            if name == "_running":
                v["_unpreemptible"] = {"t": "dict", "#": next_id, "v": [[n, g] for n, g in gpus_on.items()]}
                next_id += 1
        e["v"] = v
    return {**doc, "schema_version": 6}


# from-version -> a function rewriting a document of that version into the next one
MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {
    1: _cordons_added,
    2: _one_notice_type,
    3: _holds_own_object,
    4: _pool_knows_cordons,
    5: _unpreemptible_counted,
}


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
        try:
            doc = migrate(doc)
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise SnapshotVersionError(
                f"{source}: snapshot schema version {version} does not migrate to {version + 1}: {exc!r}"
            ) from exc
        version = doc["schema_version"]
    try:
        state = decode_state(doc["state"])
    except (StateCodecError, KeyError) as exc:
        raise SnapshotVersionError(f"{source}: snapshot (schema version {version}) does not load: {exc}") from exc
    if not isinstance(state, LiveState):
        raise SnapshotVersionError(f"{source}: snapshot holds a {type(state).__name__}, not a LiveState")
    return Snapshot(state, int(doc["wal_seq"]), float(doc["taken_at"]))
