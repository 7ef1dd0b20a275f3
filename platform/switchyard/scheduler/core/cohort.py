"""The cohort tree's arithmetic: per (cohort, GPU type), how many GPUs its members keep from
everyone outside it, and whether a change of their usage keeps its borrowing limit.

Kueue's hierarchical cohorts, over the cluster's real capacity. Every node of the tree, a
quota entry or a cohort, has a *footprint* per GPU type: what nobody outside it may use.

  * an entry's footprint is `max(usage, guarantee - lendable)` (quota.QuotaBook._floor);
  * a cohort's is `max(sum of its members' footprints, guarantee - lending limit)`, its
    guarantee being the sum of its members' guarantees (a cohort owns no GPUs itself);
  * a cohort's members *borrow from outside it* by `sum of footprints - guarantee`, at most
    its borrowing limit. Borrowing between members (one uses what a sibling leaves idle and
    lends) moves nothing across the cohort's edge, so it is free of that limit: members
    borrow inside the cohort first;
  * the cluster (the root) holds the top-level footprints; a borrower is admitted while they
    fit the GPUs of its type.

With no cohorts every entry sits under the root and the arithmetic is the flat one it was.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.scheduler.core.policy import Cohort, Quota

QuotaKey = tuple[str, int]  # (team, index of the quota entry in Team.quotas)
CohortCell = tuple[str, str]  # (cohort, GPU type)


@dataclass(frozen=True, slots=True)
class CohortBreach:
    """The first cohort whose borrowing limit a change would pass."""

    cohort: str
    gpu_type: str
    borrowed_gpus: int
    limit_gpus: int

    def describe(self) -> str:
        kind = f" ({self.gpu_type})" if self.gpu_type else ""
        return (
            f"borrowing limit of cohort {self.cohort!r}{kind}: would borrow {self.borrowed_gpus}, "
            f"limit {self.limit_gpus}"
        )


class CohortLedger:
    """Footprints per (cohort, GPU type), kept up to date as entries' footprints change."""

    def __init__(
        self,
        cohorts: tuple[Cohort, ...],
        quotas: Mapping[QuotaKey, Quota],
        team_cohort: Mapping[str, str | None],
    ) -> None:
        self._parent: dict[str, str | None] = {c.name: c.parent for c in cohorts}
        self._depth = {c.name: self._depth_of(c.name) for c in cohorts}
        self._entry_parent: dict[QuotaKey, str | None] = {k: team_cohort[k[0]] for k in quotas}
        self._entry_type: dict[QuotaKey, str] = {k: q.gpu_type for k, q in quotas.items()}
        self._guarantee: dict[CohortCell, int] = {}
        for key, quota in quotas.items():
            for cohort in self.ancestors(key):
                cell = (cohort, quota.gpu_type)
                self._guarantee[cell] = self._guarantee.get(cell, 0) + quota.guaranteed_gpus
        types = {q.gpu_type for q in quotas.values()}
        self._borrowing_limit: dict[CohortCell, int] = {}
        self._kept: dict[CohortCell, int] = {}  # guarantee - lending limit: never lent out
        for spec in cohorts:
            for gpu_type in types:
                limits = spec.limits_for(gpu_type)
                cell = (spec.name, gpu_type)
                if limits.borrowing_limit_gpus is not None:
                    self._borrowing_limit[cell] = limits.borrowing_limit_gpus
                if limits.lending_limit_gpus is not None:
                    self._kept[cell] = max(0, self._guarantee.get(cell, 0) - limits.lending_limit_gpus)
        self._inner: dict[CohortCell, int] = {}  # sum of the members' footprints
        # A cohort that keeps part of its guarantee back holds it with no member running.
        for name in sorted(self._parent, key=lambda c: -self._depth[c]):
            parent = self._parent[name]
            for gpu_type in types:
                if parent is not None:
                    cell = (parent, gpu_type)
                    self._inner[cell] = self._inner.get(cell, 0) + self.footprint((name, gpu_type))
        self._top = [c for c, p in self._parent.items() if p is None]
        self._types = types

    def root_footprints(self) -> dict[str, int]:
        """What the top-level cohorts keep from the rest of the cluster, per GPU type."""
        return {t: sum(self.footprint((c, t)) for c in self._top) for t in self._types}

    def _depth_of(self, name: str) -> int:
        depth, seen = 0, {name}
        parent = self._parent[name]
        while parent is not None:
            if parent in seen:
                raise ValueError(f"cohort {name!r}: its parents form a cycle through {parent!r}")
            seen.add(parent)
            depth += 1
            parent = self._parent[parent]
        return depth

    def ancestors(self, key: QuotaKey) -> list[str]:
        """The cohorts above an entry, nearest first."""
        out = []
        cohort = self._entry_parent[key]
        while cohort is not None:
            out.append(cohort)
            cohort = self._parent[cohort]
        return out

    def footprint(self, cell: CohortCell) -> int:
        return max(self._inner.get(cell, 0), self._kept.get(cell, 0))

    def borrowed(self, cell: CohortCell) -> int:
        """GPUs its members use from outside it (0 when within its guarantee)."""
        return max(0, self._inner.get(cell, 0) - self._guarantee.get(cell, 0))

    def limit(self, cell: CohortCell) -> int | None:
        return self._borrowing_limit.get(cell)

    def guarantee(self, cell: CohortCell) -> int:
        return self._guarantee.get(cell, 0)

    def apply(self, key: QuotaKey, footprint_delta: int) -> int:
        """An entry's footprint moved by `footprint_delta`; returns how far the root's moved."""
        delta = footprint_delta
        gpu_type = self._entry_type[key]
        cohort = self._entry_parent[key]
        while cohort is not None and delta:
            cell = (cohort, gpu_type)
            before = self.footprint(cell)
            self._inner[cell] = self._inner.get(cell, 0) + delta
            delta = self.footprint(cell) - before
            cohort = self._parent[cohort]
        return delta

    def after(self, deltas: Mapping[QuotaKey, int]) -> tuple[int, CohortBreach | None]:
        """What entries' footprint changes (`deltas`, all of one GPU type) would do, applied
        together: how far the root's footprint moves, and the first cohort on a growing
        entry's path that would borrow past its limit (nearest the entry first)."""
        inner: dict[str, int] = {}
        root = 0
        gpu_type = ""
        for key, delta in deltas.items():
            gpu_type = self._entry_type[key]
            parent = self._entry_parent[key]
            if parent is None:
                root += delta
            else:
                inner[parent] = inner.get(parent, 0) + delta
        breach: CohortBreach | None = None
        for depth in range(max(self._depth.values(), default=-1), -1, -1):  # children before parents
            for cohort in [c for c in inner if self._depth[c] == depth]:
                change = inner.pop(cohort)
                cell = (cohort, gpu_type)
                before = self.footprint(cell)
                total = self._inner.get(cell, 0) + change
                limit = self._borrowing_limit.get(cell)
                if breach is None and limit is not None and change > 0:
                    borrowed = total - self._guarantee.get(cell, 0)
                    if borrowed > limit:
                        breach = CohortBreach(cohort, gpu_type, borrowed, limit)
                moved = max(total, self._kept.get(cell, 0)) - before
                parent = self._parent[cohort]
                if parent is None:
                    root += moved
                elif moved:
                    inner[parent] = inner.get(parent, 0) + moved
        return root, breach
