"""Pending workloads, grouped by priority level, team, quota class, gang shape and GPU types.

Requests in one group are interchangeable for admission: if the group's first request can
neither be placed nor admitted, no later one can within the same decision (capacity and
quota only shrink during a decision). The scheduler therefore visits groups, not requests,
which keeps a decision's cost independent of how many thousands of requests are queued.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from switchyard.scheduler.core.model import GangRequest, PendingWorkload

GroupKey = tuple[int, str, str, str, tuple[int, ...], str, bool, str | None, tuple[str, ...]]


def group_key(priority_value: int, request: GangRequest) -> GroupKey:
    return (
        priority_value,
        request.team,
        request.workload_class.value,
        request.priority_class,
        request.bundles,
        request.strategy.value,
        request.same_node_group,
        request.node_group,
        request.gpu_types,  # a request for a full type must not block one for another
    )


def _order(p: PendingWorkload) -> tuple[float, str]:
    return (p.queued_at, p.request.workload_id)


class PendingQueues:
    def __init__(self) -> None:
        self._groups: dict[GroupKey, list[PendingWorkload]] = {}
        self._where: dict[str, GroupKey] = {}

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, workload_id: object) -> bool:
        return workload_id in self._where

    def add(self, priority_value: int, item: PendingWorkload) -> None:
        workload = item.request.workload_id
        if workload in self._where:
            raise ValueError(f"workload {workload!r} is already queued")
        key = group_key(priority_value, item.request)
        bisect.insort(self._groups.setdefault(key, []), item, key=_order)
        self._where[workload] = key

    def remove(self, workload_id: str) -> PendingWorkload:
        key = self._where.pop(workload_id)
        group = self._groups[key]
        for i, item in enumerate(group):
            if item.request.workload_id == workload_id:
                del group[i]
                if not group:
                    del self._groups[key]
                return item
        raise AssertionError(f"queue index lost workload {workload_id!r}")

    def get(self, workload_id: str) -> PendingWorkload:
        for item in self._groups[self._where[workload_id]]:
            if item.request.workload_id == workload_id:
                return item
        raise AssertionError(f"queue index lost workload {workload_id!r}")

    def level_of(self, workload_id: str) -> int:
        """The priority level `workload_id` is queued at."""
        return self._where[workload_id][0]

    def levels(self) -> list[int]:
        """Priority values with pending work, highest first."""
        return sorted({k[0] for k in self._groups}, reverse=True)

    def groups_at(self, value: int) -> list[tuple[GroupKey, list[PendingWorkload]]]:
        """Each group at one level, as a copy that stays valid while the queues change."""
        return [(k, list(g)) for k, g in self._groups.items() if k[0] == value]

    def heads(self) -> Iterator[PendingWorkload]:
        """The first (oldest) request of every group."""
        for group in self._groups.values():
            yield group[0]

    def items(self) -> Iterator[PendingWorkload]:
        for group in self._groups.values():
            yield from group
