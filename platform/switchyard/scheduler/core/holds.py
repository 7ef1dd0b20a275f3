"""Reservations: which GPUs on which nodes are held, for whom, and what that leaves to backfill.

A blocked gang, a starving gang or a preemptor waiting for its victims *holds* GPUs on chosen
nodes (`HoldKind`); a cordoned node is held whole with no owner. Backfill never takes held
GPUs, except that a request may use its own hold and holds of strictly lower priority (a
reservation only stops backfill; higher-priority work would have gone first in the queue).

`Holds` owns the per-node ledger of held GPUs beside the node pool's free GPUs, and keeps how
many free GPUs are held (`open_gpus`) exact on every change, because a decision asks for it
once per request it considers. Which nodes a new hold takes is `reservation_amounts`, a pure
choice over the pool.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from switchyard.scheduler.core.model import GangRequest, HoldKind, PlacementStrategy, Reservation
from switchyard.scheduler.core.placement import NodePool
from switchyard.scheduler.core.starvation import HoldCounts


class Holds:
    def __init__(self, pool: NodePool) -> None:
        self._pool = pool
        self._amounts: dict[str, dict[str, int]] = {}  # workload -> GPUs held per node
        self._value: dict[str, int] = {}  # workload -> its priority value
        self._kind: dict[str, HoldKind] = {}  # workload -> why it holds
        self._team: dict[str, str] = {}  # workload -> its team (per-team caps)
        self.counts = HoldCounts()
        self._waived_cache: dict[int, dict[str, int]] = {}  # priority value -> GPUs it may use
        self.per_node: dict[str, int] = {}  # node -> GPUs held by all holds and cordons
        self._held_free = 0  # free GPUs that holds cover: sum of min(free, held) per node

    @classmethod
    def from_core_fields(cls, fields: dict[str, Any]) -> Holds:
        """The holds of a core pickled when they were its own fields (`_reserved`, `_held` and
        the rest), which this takes out of `fields`. Hold counts older still are recounted."""
        holds = cls(fields["_pool"])
        holds._amounts = fields.pop("_reserved")
        holds._value = fields.pop("_reserved_value")
        holds._kind = fields.pop("_hold_kind")
        holds._team = fields.pop("_hold_team")
        holds.per_node = fields.pop("_held")
        holds._held_free = fields.pop("_held_free")
        fields.pop("_waived_cache", None)
        counts = fields.pop("_hold_counts", None)
        if counts is None:
            counts = HoldCounts()
            for workload, kind in holds._kind.items():
                counts.add(kind, holds._team[workload])
        holds.counts = counts
        return holds

    # -- who holds what -------------------------------------------------------------------------
    def __contains__(self, workload_id: object) -> bool:
        return workload_id in self._amounts

    def __iter__(self) -> Iterator[str]:
        return iter(self._amounts)

    def __len__(self) -> int:
        return len(self._amounts)

    def kind_of(self, workload_id: str) -> HoldKind | None:
        return self._kind.get(workload_id)

    def kinds(self) -> dict[str, HoldKind]:
        return dict(self._kind)

    def team_of(self, workload_id: str) -> str:
        return self._team[workload_id]

    def amounts(self) -> dict[str, dict[str, int]]:
        """workload -> GPUs it holds per node (the live mapping: callers must not change it)."""
        return self._amounts

    def on_node(self, node: str) -> list[str]:
        return [w for w, amounts in self._amounts.items() if node in amounts]

    def reservations(self) -> list[Reservation]:
        return [Reservation(w, tuple(sorted(r.items())), self._kind[w]) for w, r in self._amounts.items()]

    # -- changes --------------------------------------------------------------------------------
    def add(self, request: GangRequest, value: int, amounts: dict[str, int], kind: HoldKind) -> None:
        workload_id = request.workload_id
        self.drop(workload_id)
        self._waived_cache.clear()
        self._amounts[workload_id] = amounts
        self._value[workload_id] = value
        self._kind[workload_id] = kind
        self._team[workload_id] = request.team
        self.counts.add(kind, request.team)
        for node, gpus in amounts.items():
            self.node_change(node, gpus_held=gpus)

    def drop(self, workload_id: str) -> None:
        amounts = self._amounts.pop(workload_id, None)
        if amounts is None:
            return
        self._waived_cache.clear()
        del self._value[workload_id]
        self.counts.remove(self._kind.pop(workload_id), self._team.pop(workload_id))
        for node, gpus in amounts.items():
            self.node_change(node, gpus_held=-gpus)

    def node_change(self, node: str, gpus_freed: int = 0, gpus_held: int = 0) -> None:
        """Apply a change to a node's free GPUs (in the pool) or held GPUs, keeping
        `open_gpus` exact."""
        held = self.per_node.get(node, 0)
        self._held_free -= min(self._pool.free(node), held)
        if gpus_freed > 0:
            self._pool.release(node, gpus_freed)
        elif gpus_freed < 0:
            self._pool.allocate(node, -gpus_freed)
        held += gpus_held
        if held:
            self.per_node[node] = held
        else:
            self.per_node.pop(node, None)
        self._held_free += min(self._pool.free(node), held)

    # -- what a request may use -----------------------------------------------------------------
    def open_gpus(self) -> int:
        """Free GPUs that nothing holds."""
        return self._pool.free_gpus - self._held_free

    def waived_for(self, workload_id: str, value: int) -> dict[str, int]:
        """Held GPUs a request of priority `value` may use anyway: its own hold, and holds of
        lower priority. Empty for plain backfill, the common case."""
        lower = self._waived_cache.get(value)
        if lower is None:
            lower = {}
            for other, amounts in self._amounts.items():
                if self._value[other] < value:
                    for node, gpus in amounts.items():
                        lower[node] = lower.get(node, 0) + gpus
            self._waived_cache[value] = lower
        own = self._amounts.get(workload_id)
        if not own or self._value[workload_id] < value:
            return lower  # its own hold is already among the lower ones (or absent)
        merged = dict(lower)
        for node, gpus in own.items():
            merged[node] = merged.get(node, 0) + gpus
        return merged

    def held_without(self, waived: dict[str, int]) -> dict[str, int]:
        """GPUs held per node, less those `waived` (the live mapping when nothing is waived)."""
        if not waived:
            return self.per_node
        out = dict(self.per_node)
        for node, gpus in waived.items():
            left = out[node] - gpus
            if left:
                out[node] = left
            else:
                del out[node]
        return out


def reservation_amounts(
    pool: NodePool, request: GangRequest, held: dict[str, int], gpu_type: str | None
) -> dict[str, int] | None:
    """GPUs per node a new hold for `request` takes: the nodes closest to fitting it (most
    GPUs free besides `held`), in one node group when the gang needs one (the group with most
    GPUs free, among groups of `gpu_type` when that is not None). None: nowhere fits it."""
    group = request.node_group
    if group is None and request.same_node_group and len(request.bundles) > 1:
        groups = [g for g in pool.group_names() if gpu_type is None or pool.group_type(g) == gpu_type]
        if not groups:
            return None
        free_by_group: dict[str, int] = {}
        cordoned = pool.cordoned()  # their free GPUs take no lease
        for node in pool.nodes():
            if node.name not in cordoned:
                free_by_group[node.node_group] = free_by_group.get(node.node_group, 0) + pool.free(node.name)
        group = max(groups, key=lambda g: (free_by_group.get(g, 0), g))
    if len(request.bundles) == 1 or request.strategy is PlacementStrategy.STRICT_PACK:
        nodes = pool.most_free((request.gpus,), group, held)
        return None if nodes is None else {nodes[0]: request.gpus}
    nodes = pool.most_free(request.bundles, group, held)
    if nodes is None:
        return None
    amounts: dict[str, int] = {}
    for name, size in zip(nodes, request.bundles, strict=True):
        amounts[name] = amounts.get(name, 0) + size
    return amounts
