"""Granted GPUs are held against Serve until the workload they were granted to is done with them.

Serve places its replicas itself: a replica is a Ray actor asking for GPUs, and Ray puts it on
any node with room. Between a grant and the moment its job's own placement group forms (a
launch through the Jobs API, then Ray Train starting its workers: seconds), the granted GPUs
are free in Ray's eyes, and a replica Ray places then would take them.

The mechanism is one custom resource, `switchyard_serve_gpu`, as many per node as it has GPUs,
which every GPU replica the platform deploys asks for beside its GPUs (`serve_gpu_options`).
For every grant but the Serve pool's own, the scheduler creates a placement group whose bundles
reserve that resource on the granted nodes, as many as GPUs granted there: Ray's own resource
accounting then leaves a replica only the GPUs no grant holds, on every node, whatever order
events arrive in. Training itself never asks for the resource, so its placement group forms
beside the hold. A hold lasts as long as its grant and is removed with it.

A hold is a placement group and forms asynchronously: a replica Ray placed in the few
milliseconds before it formed holds the slots, and the hold cannot form. The grant is then
void (`Driver.grant_displaced`): the scheduler takes it back before any job used it. So a
launch waits for its hold (`formed`). Holds are detached (they outlive an actor restart,
when the next incarnation adopts them by name) and named `switchyard-hold:<scheduler>:<lease id>`
(`<scheduler>` is the actor's name: a test's second scheduler leaves the first one's alone).
See docs/live_scheduler.md, "Granted GPUs are held against Serve".
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group

log = logging.getLogger(__name__)

SERVE_GPU_RESOURCE = "switchyard_serve_gpu"
HOLD_NAME_PREFIX = "switchyard-hold:"
HOLD_TIMEOUT_S = 10.0  # a hold on free slots forms in milliseconds; 10 s under a loaded GCS means someone took them
RAY_NODE_ID_KEY = "ray.io/node-id"
NODE_SLOTS_TTL_S = 2.0


def serve_gpu_options(gpus: int, ray_actor_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A GPU replica's `ray_actor_options`: its GPUs and as many Serve slots (see the module)."""
    options = dict(ray_actor_options or {})
    resources = dict(options.get("resources") or {})
    resources[SERVE_GPU_RESOURCE] = gpus
    return {**options, "num_gpus": gpus, "resources": resources}


def node_resources(gpus: int) -> dict[str, float]:
    """The custom resources a GPU node declares (`ray start --resources`, `Cluster.add_node`)."""
    return {SERVE_GPU_RESOURCE: float(gpus)} if gpus > 0 else {}


@dataclass
class _Hold:
    group: PlacementGroup
    ready: Any  # the ObjectRef of `group.ready()`
    since: float
    formed: bool = False


def _hold_groups(prefix: str) -> dict[str, PlacementGroup]:
    """Placement groups not removed whose names start with `prefix`: name -> group."""
    out = {}
    for group_id, row in placement_group_table().items():
        name = str(row.get("name") or "")
        if name.startswith(prefix) and row.get("state") != "REMOVED":
            out[name] = PlacementGroup(ray.PlacementGroupID.from_hex(group_id))
    return out


def remove_holds(scheduler: str | None = None) -> int:
    """Remove the holds of scheduler actor `scheduler` (every scheduler's when None): what `down`
    and a test's teardown do once the actor is gone. Returns how many."""
    groups = _hold_groups(HOLD_NAME_PREFIX + (f"{scheduler}:" if scheduler else ""))
    for group in groups.values():
        remove_placement_group(group)
    return len(groups)


class GrantHolds:
    """The holds of the current grants: `reconcile` makes them match the grants the driver has."""

    def __init__(self, scheduler: str, timeout_s: float = HOLD_TIMEOUT_S) -> None:
        self._prefix = f"{HOLD_NAME_PREFIX}{scheduler}:"
        self._timeout_s = timeout_s
        self._lock = threading.Lock()  # the tick thread reconciles; a launch on any thread waits
        self._holds: dict[str, _Hold] = {}
        self._given_up: set[str] = set()  # holds that did not form: not tried again for that lease
        self._slots: dict[str, int] = {}
        self._slots_at = -NODE_SLOTS_TTL_S
        self._adopt_existing()

    def _adopt_existing(self) -> None:
        """Holds a previous incarnation created: kept by lease id; the first reconcile removes
        those no grant wants any more."""
        for name, group in _hold_groups(self._prefix).items():
            self._holds[name[len(self._prefix) :]] = _Hold(group, group.ready(), time.monotonic())

    def reconcile(self, wanted: Mapping[str, tuple[tuple[str, int], ...]]) -> list[str]:
        """Hold what `wanted` (lease id -> (node, GPUs)) names and nothing else. Returns the
        leases whose hold did not form within the timeout: their GPUs went to someone else
        (their holds are removed, so they never form later in a replica's place)."""
        with self._lock:
            for lease_id in self._holds.keys() - wanted.keys():
                self._remove(lease_id)
            self._given_up &= wanted.keys()
            for lease_id in wanted.keys() - self._holds.keys() - self._given_up:
                self._create(lease_id, wanted[lease_id])
            return self._overdue()

    def formed(self, lease_id: str) -> bool:
        """Whether `lease_id`'s hold has formed (without waiting). A lease with no hold (no
        Serve slots on its nodes) is held by nothing, and counts as formed."""
        with self._lock:
            hold = self._holds.get(lease_id)
            if hold is not None and not hold.formed:
                ready, _ = ray.wait([hold.ready], timeout=0)
                hold.formed = bool(ready)
            return hold is None or hold.formed

    def _create(self, lease_id: str, placements: tuple[tuple[str, int], ...]) -> None:
        slots = self._node_slots()
        bundles, selectors = [], []
        for node, gpus in placements:
            held = min(gpus, slots.get(node, 0))  # a node without slots hosts no Serve GPU replica
            if held > 0:
                bundles.append({SERVE_GPU_RESOURCE: float(held)})
                selectors.append({RAY_NODE_ID_KEY: node})
        if not bundles:
            return
        name = self._prefix + lease_id
        group = placement_group(bundles, "PACK", name, lifetime="detached", bundle_label_selector=selectors)
        self._holds[lease_id] = _Hold(group, group.ready(), time.monotonic())

    def _remove(self, lease_id: str) -> None:
        hold = self._holds.pop(lease_id)
        try:
            remove_placement_group(hold.group)
        except Exception as exc:  # noqa: BLE001 - gone already (Ray raises several types): nothing to free
            log.info("hold of lease %s: removing it: %s", lease_id, exc)

    def _overdue(self) -> list[str]:
        pending = {h.ready: (lease_id, h) for lease_id, h in self._holds.items() if not h.formed}
        if not pending:
            return []
        ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=0)
        for ref in ready:
            pending.pop(ref)[1].formed = True
        now = time.monotonic()
        late = [lease_id for lease_id, h in pending.values() if now - h.since > self._timeout_s]
        for lease_id in late:
            self._remove(lease_id)
            self._given_up.add(lease_id)
        return late

    def _node_slots(self) -> dict[str, int]:
        if time.monotonic() - self._slots_at >= NODE_SLOTS_TTL_S:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            self._slots = {n["NodeID"]: int(n.get("Resources", {}).get(SERVE_GPU_RESOURCE, 0)) for n in nodes}
            self._slots_at = time.monotonic()
        return self._slots
