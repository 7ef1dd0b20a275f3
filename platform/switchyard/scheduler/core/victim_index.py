"""The running leases a preemption may take, kept across decisions so that a victim search
need not rank every lease of the cluster.

The scheduler tells the index when a preemptible lease starts running, stops running (it was
noticed, released or lost its node) and reports a checkpoint. Per lease a `VictimEntry` holds
what does not change while it runs: its quota entry, priority, GPUs per node, when its
protection ends and the tie-breaks of the victim order. Three views:

  * by quota entry and priority value (a *cell*): a search skips whole cells it may not take;
  * by node: a search costs one node from that node's entries alone;
  * `cheapest(now, need)`: every entry in nondecreasing order of a lower bound on what
    clearing a node costs (below) if that node's cheapest candidate is this entry, without
    computing it for the rest. A lease of g GPUs last checkpointed w seconds ago costs
    `g x (w + restart_cost_s)` to stop; a node that needs `need` GPUs freed loses at least
    `w + restart_cost_s` per freed GPU, so at least `(w + restart_cost_s) x max(g, need)`
    (one victim: g >= need; several: at least need GPUs, none cheaper per GPU than the
    cheapest). Entries are grouped by GPU count, where that bound orders like w, the time
    since the last checkpoint; w is kept in two orders that do not move with time:
      - *anchor* order (latest reported checkpoint or start, newest first): exact for a lease
        without a declared interval, and a second key for one that reported a checkpoint;
      - *phase* order (start modulo the declared interval): a lease with interval I last
        checkpointed `(now - start) mod I` ago, so walking the phases down from
        `now mod I` visits them by time since their last periodic checkpoint.
    A lease in both orders (periodic, and reported) costs the smaller of its two keys, so it
    comes out at the first. The phase keys are floats: each is lowered by `_slack(now)` and the
    few leases within that slack of a period boundary come first, so every key stays at or
    below the exact cost that `Lease.lost_gpu_seconds` computes.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Collection, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import TypeVar

from switchyard.scheduler.core.model import Lease, PreemptionReason
from switchyard.scheduler.core.policy import PriorityClass
from switchyard.scheduler.core.protection import protected_until
from switchyard.scheduler.core.quota import QuotaKey

Cell = tuple[QuotaKey, int]  # (quota entry, priority value)
_Where = TypeVar("_Where", bound=Hashable)
LAST_RESORT_S = 1e12  # per GPU: one such victim outweighs any plan of others (1,000 GPUs x 3 years: 1e11)
_LAST_ID = "\U0010ffff"  # sorts after every lease id: bisect past all entries of one key


def _slack(now: float) -> float:
    """Seconds by which a phase key may be off: far above float error at `now` (1e-9 s at a
    month of simulated time, 2e-7 s at a unix epoch), far below any checkpoint interval."""
    return 1e-3 + abs(now) * 1e-12


@dataclass(frozen=True, slots=True)
class VictimEntry:
    lease: Lease
    key: QuotaKey
    value: int
    gpus: int
    restart: float
    """`gpus x restart_cost_s`, computed as the ranking adds it."""
    priority_from: float
    """Earliest time priority preemption may take it (`protection.protected_until`)."""
    reclaim_from: float
    """Earliest time reclaim may take it (none of this applies to inference reclaim)."""
    tie: tuple[int, float, str]
    """The victim order after the cost: lower priority, most recently started, lease id."""
    last_resort: bool = False
    """A settled lease that is not immune (`core.settled`): inference reclaim's alone, last."""


class VictimIndex:
    def __init__(self, restart_cost_s: float) -> None:
        self._restart_cost_s = restart_cost_s
        self._entries: dict[str, VictimEntry] = {}
        self._cells: dict[Cell, dict[str, VictimEntry]] = {}
        self._nodes: dict[str, dict[str, VictimEntry]] = {}
        self._anchor: dict[int, list[tuple[float, str]]] = {}  # gpus -> (-anchor, lease id)
        self._anchored: dict[str, float] = {}  # lease id -> its anchor in that list
        self._phase: dict[tuple[int, float], list[tuple[float, str]]] = {}  # (gpus, I) -> (phase, id)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, lease_id: object) -> bool:
        return lease_id in self._entries

    # -- upkeep -----------------------------------------------------------------------------
    def add(self, lease: Lease, key: QuotaKey, priority: PriorityClass, *, last_resort: bool = False) -> None:
        """A running lease of a preemptible class. `last_resort` (a settled lease that is not
        immune, `core.settled`): only inference reclaim may take it, and it costs
        `LAST_RESORT_S` per GPU and earlier preemption more, so a plan takes it only when no
        plan without it exists, and the least preempted first."""
        lease_id = lease.lease_id
        if lease_id in self._entries:
            raise AssertionError(f"lease {lease_id!r} is already a possible victim")
        # Exposed leases preempted more often cost more, so inference spreads its last resorts.
        restart_s = self._restart_cost_s + (LAST_RESORT_S * lease.prior_preemptions if last_resort else 0.0)
        entry = VictimEntry(
            lease,
            key,
            priority.value,
            lease.gpus,
            lease.gpus * restart_s,
            protected_until(lease, priority, PreemptionReason.PRIORITY),
            protected_until(lease, priority, PreemptionReason.RECLAIM),
            (priority.value, -lease.started_at, lease_id),
            last_resort,
        )
        self._entries[lease_id] = entry
        self._cells.setdefault((key, priority.value), {})[lease_id] = entry
        for node in lease.gpus_by_node():
            self._nodes.setdefault(node, {})[lease_id] = entry
        interval = _interval(lease)
        if interval is not None:
            bisect.insort(self._phase.setdefault((entry.gpus, interval), []), (lease.started_at % interval, lease_id))
        self._anchor_at(entry)

    def remove(self, lease_id: str) -> None:
        """The lease is no longer a possible victim (noticed, released, or its node is gone)."""
        entry = self._entries.pop(lease_id)
        lease = entry.lease
        _drop(self._cells, (entry.key, entry.value), lease_id)
        for node in lease.gpus_by_node():
            _drop(self._nodes, node, lease_id)
        interval = _interval(lease)
        if interval is not None:
            _remove_sorted(self._phase, (entry.gpus, interval), (lease.started_at % interval, lease_id))
        self._unanchor(entry)

    def checkpointed(self, lease_id: str) -> None:
        """The lease reported a checkpoint (its `last_checkpoint_at` moved)."""
        entry = self._entries.get(lease_id)
        if entry is None:
            return  # not a possible victim (not preemptible, or already noticed)
        self._unanchor(entry)
        self._anchor_at(entry)

    def _anchor_at(self, entry: VictimEntry) -> None:
        lease = entry.lease
        if _interval(lease) is not None and lease.last_checkpoint_at is None:
            return  # its periodic checkpoints alone: the phase order has it
        reported = lease.last_checkpoint_at
        anchor = lease.started_at if reported is None else max(lease.started_at, reported)
        self._anchored[lease.lease_id] = anchor
        bisect.insort(self._anchor.setdefault(entry.gpus, []), (-anchor, lease.lease_id))

    def _unanchor(self, entry: VictimEntry) -> None:
        anchor = self._anchored.pop(entry.lease.lease_id, None)
        if anchor is not None:
            _remove_sorted(self._anchor, entry.gpus, (-anchor, entry.lease.lease_id))

    # -- views ------------------------------------------------------------------------------
    def cells(self) -> Iterable[tuple[Cell, Collection[VictimEntry]]]:
        return ((cell, entries.values()) for cell, entries in self._cells.items())

    def on_node(self, node: str) -> Iterable[VictimEntry]:
        found = self._nodes.get(node)
        return () if found is None else found.values()

    def entries(self) -> Iterable[VictimEntry]:
        return self._entries.values()

    def get(self, lease_id: str) -> VictimEntry | None:
        return self._entries.get(lease_id)

    def cheapest(self, now: float, need: int) -> Iterator[tuple[float, VictimEntry]]:
        """(lower bound on the cost of clearing `need` or more GPUs on a node whose cheapest
        candidate it is, entry), bounds nondecreasing; an entry may come twice (the first
        time at or below the truth). `need` >= 1."""
        slack = _slack(now)
        restart_s = self._restart_cost_s
        streams = [
            self._by_anchor(ordered, now, restart_s, max(gpus, need))
            for gpus, ordered in self._anchor.items()
        ]
        streams += [
            self._by_phase(interval, ordered, now, slack, restart_s, max(gpus, need))
            for (gpus, interval), ordered in self._phase.items()
        ]
        return heapq.merge(*streams, key=_bound)

    def _by_anchor(
        self, ordered: list[tuple[float, str]], now: float, restart_s: float, per: int
    ) -> Iterator[tuple[float, VictimEntry]]:
        entries = self._entries
        for negative_anchor, lease_id in ordered:
            # Exact w for a lease without an interval; one with an interval has checkpointed
            # periodically since, or not: its w is the smaller of this and its phase key.
            yield (max(0.0, now + negative_anchor) + restart_s) * per, entries[lease_id]

    def _by_phase(
        self, interval: float, ordered: list[tuple[float, str]], now: float, slack: float, restart_s: float, per: int
    ) -> Iterator[tuple[float, VictimEntry]]:
        entries = self._entries
        pivot = now % interval
        n = len(ordered)
        start = bisect.bisect_right(ordered, (pivot, _LAST_ID))  # phases <= pivot lie before it
        # Phases just above the pivot (circularly) are about a whole interval since their last
        # periodic checkpoint, or just past one if the float is off: they go first, at -slack.
        edge = _count_between(ordered, pivot, pivot + slack, interval)
        floor = (restart_s - slack) * per
        for k in range(edge):
            yield floor, entries[ordered[(start + edge - 1 - k) % n][1]]
        for k in range(n - edge):
            phase, lease_id = ordered[(start - 1 - k) % n]
            yield ((pivot - phase) % interval - slack + restart_s) * per, entries[lease_id]


def _bound(item: tuple[float, VictimEntry]) -> float:
    return item[0]


def _interval(lease: Lease) -> float | None:
    interval = lease.request.checkpoint_interval_s
    return interval if interval is not None and interval > 0 else None  # as Lease.checkpointed_at


def _count_between(ordered: list[tuple[float, str]], low: float, high: float, interval: float) -> int:
    """Phases in (low, high] taken circularly modulo `interval` (low in [0, interval))."""
    below_high = bisect.bisect_right(ordered, (min(high, interval), _LAST_ID))
    count = below_high - bisect.bisect_right(ordered, (low, _LAST_ID))
    if high >= interval:
        count += bisect.bisect_right(ordered, (high - interval, _LAST_ID))
    return min(count, len(ordered))


def _drop(index: dict[_Where, dict[str, VictimEntry]], where: _Where, lease_id: str) -> None:
    members = index[where]
    del members[lease_id]
    if not members:
        del index[where]


def _remove_sorted(index: dict[_Where, list[tuple[float, str]]], where: _Where, item: tuple[float, str]) -> None:
    ordered = index[where]
    i = bisect.bisect_left(ordered, item)
    if i == len(ordered) or ordered[i] != item:
        raise AssertionError(f"victim index lost {item!r}")
    del ordered[i]
    if not ordered:
        del index[where]
