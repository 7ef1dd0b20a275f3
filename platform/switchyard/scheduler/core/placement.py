"""Where a gang goes: the node inventory and topology-aware, all-or-nothing bundle placement.

Single-bundle requests (most of them) take the best-fitting node from a free-count index, so
small jobs fill partly used nodes and whole nodes stay free for 8-GPU gangs (less
fragmentation). Multi-bundle gangs are placed inside one node group when asked, packing
bundles onto nodes already chosen, then the same rack, then the tightest fit.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping

from switchyard.scheduler.core.model import GangRequest, Node, PlacementStrategy

_EMPTY: Mapping[str, int] = {}
# Held on every node of another GPU type, so that a search for one type never lands there
# whatever victims or waived reservations add.
_OTHER_TYPE = 1 << 30


class NodePool:
    """GPU inventory per node, indexed by free count; the only owner of allocation arithmetic."""

    def __init__(self, nodes: Iterable[Node] = ()) -> None:
        self._nodes: dict[str, Node] = {}
        self._free: dict[str, int] = {}
        self._buckets: dict[int, dict[str, None]] = {}  # free count -> nodes (insertion order)
        self._groups: dict[str, dict[str, None]] = {}
        self._group_free: dict[str, int] = {}
        self._type_gpus: dict[str, int] = {}
        self._other_types: dict[str, dict[str, int]] = {}  # type -> its exclusion (a cache)
        self._group_type: dict[str, str] = {}  # a node group is of one GPU type
        self._cordoned: set[str] = set()  # nodes that take no new lease (their holds are `Holds`')
        self.total_gpus = 0
        self.free_gpus = 0
        for node in nodes:
            self.add(node)

    # -- inventory ---------------------------------------------------------------------------
    def add(self, node: Node) -> None:
        if node.name in self._nodes:
            raise ValueError(f"node {node.name!r} already exists")
        if node.gpus <= 0:
            raise ValueError(f"node {node.name!r}: gpus must be positive, got {node.gpus}")
        group_type = self._group_type.get(node.node_group, node.gpu_type)
        if group_type != node.gpu_type:
            raise ValueError(
                f"node {node.name!r}: GPU type {node.gpu_type!r}, but node group {node.node_group!r} is {group_type!r}"
            )
        self._group_type[node.node_group] = node.gpu_type
        self._nodes[node.name] = node
        self._free[node.name] = node.gpus
        self._buckets.setdefault(node.gpus, {})[node.name] = None
        self._groups.setdefault(node.node_group, {})[node.name] = None
        self._group_free[node.node_group] = self._group_free.get(node.node_group, 0) + node.gpus
        self._type_gpus[node.gpu_type] = self._type_gpus.get(node.gpu_type, 0) + node.gpus
        self._other_types.clear()
        self.total_gpus += node.gpus
        self.free_gpus += node.gpus

    def remove(self, name: str) -> Node:
        self._cordoned.discard(name)
        node = self._nodes.pop(name)
        free = self._free.pop(name)
        del self._buckets[free][name]
        del self._groups[node.node_group][name]
        self._group_free[node.node_group] -= free
        if not self._groups[node.node_group]:
            del self._groups[node.node_group]
            del self._group_free[node.node_group]
            del self._group_type[node.node_group]
        self._type_gpus[node.gpu_type] -= node.gpus
        self._other_types.clear()
        self.total_gpus -= node.gpus
        self.free_gpus -= free
        return node

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def node(self, name: str) -> Node:
        return self._nodes[name]

    def nodes(self) -> Iterable[Node]:
        return self._nodes.values()

    def free(self, name: str) -> int:
        return self._free[name]

    def group_names(self) -> list[str]:
        return list(self._groups)

    def type_gpus(self, gpu_type: str) -> int:
        """GPUs of nodes of that type (free or not)."""
        return self._type_gpus.get(gpu_type, 0)

    def type_free(self, gpu_type: str) -> int:
        return sum(self._group_free[g] for g, t in self._group_type.items() if t == gpu_type)

    def group_type(self, group: str) -> str:
        return self._group_type[group]

    def __setstate__(self, state: dict[str, object]) -> None:
        """A pool pickled before GPU types: every node is of the implicit type; before cordons:
        none is cordoned."""
        self.__dict__.update(state)
        if "_type_gpus" not in state:
            self._type_gpus = {"": self.total_gpus}
            self._other_types = {}
            self._group_type = dict.fromkeys(self._groups, "")
        self.__dict__.setdefault("_cordoned", set())

    # -- cordons -----------------------------------------------------------------------------
    # A cordoned node is held whole (`Holds`), so no search lands there or plans victims there.
    # Its group's room is another matter: a reservation's held GPUs count against its whole
    # group even while still in use (they keep other gangs off the free nodes it moves to;
    # docs/scheduler.md, "Gang placement"), but a cordon holds no gang's place, so a cordoned
    # node just adds no room to its group, rather than taking its busy GPUs out of the rest.
    def cordon(self, name: str) -> None:
        self._cordoned.add(name)

    def uncordon(self, name: str) -> None:
        self._cordoned.discard(name)

    def cordoned(self) -> frozenset[str]:
        return frozenset(self._cordoned)

    def group_rooms(self, held: Mapping[str, int], bonus: Mapping[str, int]) -> dict[str, int]:
        """What each node group could give a gang: its free GPUs, less all held in it, plus
        `bonus`; a cordoned node gives nothing (see above). One pass over the sparse `held` and
        `bonus`, not over the groups' nodes."""
        rooms = dict(self._group_free)
        for name, gpus in held.items():
            if name in self._nodes and name not in self._cordoned:
                rooms[self._nodes[name].node_group] -= gpus
        for name, gpus in bonus.items():
            if name in self._nodes and name not in self._cordoned:
                rooms[self._nodes[name].node_group] += gpus
        for name in self._cordoned:
            rooms[self._nodes[name].node_group] -= self._free[name]
        return rooms

    def held_for_type(self, gpu_type: str, held: Mapping[str, int]) -> dict[str, int]:
        """`held`, plus every node of another GPU type held whole: what a search confined to
        `gpu_type` passes as `held` (to `find`, `most_free` and victim searches alike)."""
        others = self._other_types.get(gpu_type)
        if others is None:
            others = {n: _OTHER_TYPE for n, node in self._nodes.items() if node.gpu_type != gpu_type}
            self._other_types[gpu_type] = others
        return {**held, **others}

    def nodes_with_free(self) -> Iterator[str]:
        """The nodes with at least one free GPU."""
        for count, names in self._buckets.items():
            if count > 0:
                yield from names

    def max_free(self) -> int:
        return max((c for c, names in self._buckets.items() if names), default=0)

    def top_free(self, count: int) -> list[int]:
        """The free GPUs of the `count` nodes with most free, most first (fewer if fewer nodes)."""
        out: list[int] = []
        for free in sorted(self._buckets, reverse=True):
            for _ in self._buckets[free]:
                if len(out) == count:
                    return out
                out.append(free)
        return out

    def most_available(self, held: Mapping[str, int]) -> int:
        """The most GPUs free on one node once `held` GPUs are set aside (0 if none)."""
        best = 0
        for count in sorted(self._buckets, reverse=True):
            if count <= best:
                break
            for name in self._buckets[count]:
                best = max(best, count - held.get(name, 0))
                if best == count:
                    break
        return best

    def allocate(self, name: str, gpus: int) -> None:
        free = self._free[name]
        if gpus > free:
            raise AssertionError(f"over-allocation on {name}: {gpus} > {free} free")
        self._move(name, free, free - gpus)
        self.free_gpus -= gpus

    def release(self, name: str, gpus: int) -> None:
        free = self._free[name]
        if free + gpus > self._nodes[name].gpus:
            raise AssertionError(f"release of {gpus} on {name} exceeds its {self._nodes[name].gpus}")
        self._move(name, free, free + gpus)
        self.free_gpus += gpus

    def group_free(self, group: str) -> int:
        return self._group_free.get(group, 0)

    def group_nodes(self, group: str) -> list[str]:
        return list(self._groups.get(group, {}))

    def _move(self, name: str, old: int, new: int) -> None:
        self._group_free[self._nodes[name].node_group] += new - old
        del self._buckets[old][name]
        self._buckets.setdefault(new, {})[name] = None
        self._free[name] = new

    # -- placement ---------------------------------------------------------------------------
    def find(
        self,
        bundles: tuple[int, ...],
        strategy: PlacementStrategy,
        *,
        same_node_group: bool = False,
        node_group: str | None = None,
        held: Mapping[str, int] = _EMPTY,
        bonus: Mapping[str, int] = _EMPTY,
    ) -> tuple[str, ...] | None:
        """Nodes for each bundle, or None if the whole gang cannot fit now.

        `held` GPUs are unavailable (reservations of others); `bonus` GPUs count as free
        (held by leases being considered as preemption victims).
        """
        if len(bundles) == 1 or strategy is PlacementStrategy.STRICT_PACK:
            node = self._best_single(sum(bundles), node_group, held, bonus)
            return None if node is None else (node,) * len(bundles)
        if same_node_group or node_group is not None:
            groups = [node_group] if node_group is not None else self._groups_by_fit(held, bonus, sum(bundles))
            for group in groups:
                if group in self._groups:
                    placed = self._place_multi(bundles, strategy, self._groups[group], held, bonus)
                    if placed is not None:
                        return placed
            return None
        return self._place_multi(bundles, strategy, self._nodes, held, bonus)

    def find_gang(
        self, request: GangRequest, held: Mapping[str, int] = _EMPTY, bonus: Mapping[str, int] = _EMPTY
    ) -> tuple[str, ...] | None:
        """`find` for a request's bundles, strategy and node-group constraints."""
        return self.find(
            request.bundles,
            request.strategy,
            same_node_group=request.same_node_group,
            node_group=request.node_group,
            held=held,
            bonus=bonus,
        )

    def _avail(self, name: str, held: Mapping[str, int], bonus: Mapping[str, int]) -> int:
        return self._free[name] - held.get(name, 0) + bonus.get(name, 0)

    def _best_single(
        self, size: int, node_group: str | None, held: Mapping[str, int], bonus: Mapping[str, int]
    ) -> str | None:
        best: str | None = None
        best_avail = 1 << 30
        for name in bonus:  # victims' nodes are not where the index says they are
            if name not in self._nodes:
                continue
            avail = self._avail(name, held, bonus)
            if size <= avail < best_avail and self._in_group(name, node_group):
                best, best_avail = name, avail
        for count in sorted(c for c in self._buckets if c >= size):
            if count >= best_avail:
                break
            for name in self._buckets[count]:
                if name in bonus or not self._in_group(name, node_group):
                    continue
                if count - held.get(name, 0) >= size:
                    return name
        return best

    def _in_group(self, name: str, node_group: str | None) -> bool:
        return node_group is None or self._nodes[name].node_group == node_group

    def _groups_by_fit(self, held: Mapping[str, int], bonus: Mapping[str, int], need: int) -> list[str]:
        avail = self.group_rooms(held, bonus)
        # Tightest group that could hold the gang first: keep roomy groups whole for the next
        # large gang.
        return sorted((g for g, a in avail.items() if a >= need), key=lambda g: (avail[g], g))

    def _place_multi(
        self,
        bundles: tuple[int, ...],
        strategy: PlacementStrategy,
        names: Iterable[str],
        held: Mapping[str, int],
        bonus: Mapping[str, int],
    ) -> tuple[str, ...] | None:
        smallest = min(bundles)
        room = {n: a for n in names if (a := self._avail(n, held, bonus)) >= smallest}
        if sum(room.values()) < sum(bundles):
            return None
        order = sorted(range(len(bundles)), key=lambda i: -bundles[i])
        chosen: dict[int, str] = {}
        used: dict[str, None] = {}
        for i in order:
            size = bundles[i]
            node = self._pick(size, strategy, room, used)
            if node is None:
                return None
            chosen[i] = node
            room[node] -= size
            used[node] = None
        return tuple(chosen[i] for i in range(len(bundles)))

    def _pick(self, size: int, strategy: PlacementStrategy, room: dict[str, int], used: dict[str, None]) -> str | None:
        used_racks = {self._nodes[n].rack for n in used}
        best: str | None = None
        best_key: tuple[int, int, int] | None = None
        for name, avail in room.items():
            if avail < size:
                continue
            is_used = name in used
            # PACK prefers nodes (then racks) already in the gang; SPREAD avoids them.
            affinity = 0 if is_used else (1 if self._nodes[name].rack in used_racks else 2)
            if strategy is PlacementStrategy.SPREAD:
                affinity = -affinity
            key = (affinity, avail, 0)
            if best_key is None or key < best_key:
                best, best_key = name, key
        return best

    def most_free(
        self, bundles: tuple[int, ...], node_group: str | None, held: Mapping[str, int]
    ) -> tuple[str, ...] | None:
        """Nodes closest to fitting each bundle (most GPUs free now), for a reservation."""
        names: Iterable[str] = self._nodes if node_group is None else self._groups.get(node_group, {})
        ranked = sorted(
            (n for n in names if self._nodes[n].gpus - held.get(n, 0) >= max(bundles)),
            key=lambda n: -self._avail(n, held, _EMPTY),
        )
        if len(ranked) < len(bundles):
            return None
        return tuple(ranked[: len(bundles)])
