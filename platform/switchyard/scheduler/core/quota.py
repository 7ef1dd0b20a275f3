"""Quota accounting: GPUs in use per (team, quota entry), guarantees, borrowing and lending
limits. An entry is of one GPU type, and everything here is per type.

A quota entry's owner may always use its guarantee (unless a cohort above it has lent it to
borrowers: see `core.cohort`). Above it, it borrows: at most its borrowing limit, within the
borrowing limits of the cohorts above it, and only from capacity of its type that no other
entry or cohort has kept back (each keeps back the part of its unused guarantee it does not
lend).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from switchyard.scheduler.core.cohort import CohortBreach, CohortLedger
from switchyard.scheduler.core.cohort import QuotaKey as QuotaKey
from switchyard.scheduler.core.model import WorkloadClass
from switchyard.scheduler.core.policy import Cohort, Quota, Team

# The one refusal that more GPUs would lift: borrowing is capped by what the cluster can lend.
NO_LENDABLE_CAPACITY = "no lendable capacity"
_NOTHING_FREED: Mapping[QuotaKey, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    borrowing: bool
    reason: str = ""
    reclaim: bool = False
    """Refused though within its guarantee: a cohort above it lent that guarantee to
    borrowers, so taking back their GPUs (preemption) admits it."""
    cohort: str | None = None
    """With `reclaim`: the cohort whose borrowing limit refuses it. Only its members' leases
    can make room: freeing GPUs outside it leaves what it borrows unchanged."""


class QuotaBook:
    def __init__(self, teams: tuple[Team, ...], cohorts: tuple[Cohort, ...] = ()) -> None:
        self._teams = {t.name: t for t in teams}
        self._quota: dict[QuotaKey, Quota] = {(t.name, i): q for t in teams for i, q in enumerate(t.quotas)}
        self._usage: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)
        self._keys: dict[tuple[str, WorkloadClass, str], QuotaKey] = {}
        # Footprints directly under the cluster, per GPU type (with no cohorts: every entry's).
        self._kept_back: dict[str, int] = {}
        self._cohorts = CohortLedger(cohorts, self._quota, {t.name: t.cohort for t in teams}) if cohorts else None
        if self._cohorts is not None:
            self._kept_back.update(self._cohorts.root_footprints())
        for key in self._quota:
            self._move_footprint(key, self._floor(key, 0))
        # Two-phase preemption: GPUs still held by noticed victims will leave their entry, and
        # GPUs freed for a waiting preemptor will join its entry; both count as already moved
        # so that two preemptors never take the same borrowed GPUs or over-reclaim.
        self._leaving: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)
        self._arriving: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)

    def __setstate__(self, state: dict[str, object]) -> None:
        """A book pickled before GPU types and cohorts kept one kept-back count and keys
        without a type."""
        self.__dict__.update(state)
        if isinstance(self._kept_back, int):
            self._kept_back = {"": self._kept_back}
            self._keys = {}
        if "_cohorts" not in state:
            self._cohorts = None

    def key(self, team: str, workload_class: WorkloadClass, gpu_type: str = "") -> QuotaKey:
        found = self._keys.get((team, workload_class, gpu_type))
        if found is None:
            found = (team, self._teams[team].quota_index(workload_class, gpu_type))
            self._keys[(team, workload_class, gpu_type)] = found
        return found

    def quota(self, key: QuotaKey) -> Quota:
        return self._quota[key]

    def usage(self, key: QuotaKey) -> int:
        return self._usage[key]

    def team_usage(self, team: str) -> int:
        return sum(self._usage[(team, i)] for i in range(len(self._teams[team].quotas)))

    def borrowed(self, key: QuotaKey) -> int:
        return max(0, self._usage[key] - self._quota[key].guaranteed_gpus)

    def reclaimable(self, key: QuotaKey) -> int:
        """Borrowed GPUs not already being taken back by a pending preemption."""
        return max(0, self._usage[key] - self._leaving[key] - self._quota[key].guaranteed_gpus)

    def borrowing_after(self, key: QuotaKey, gpus: int) -> int:
        """GPUs the entry borrows once preemptions under way end and `gpus` more are charged."""
        after = self._usage[key] - self._leaving[key] + self._arriving[key] + gpus
        return max(0, after - self._quota[key].guaranteed_gpus)

    def reclaiming(self, key: QuotaKey, gpus: int) -> bool:
        """Would `gpus` more (after preemptions already under way) stay within the guarantee?"""
        after = self._usage[key] - self._leaving[key] + self._arriving[key] + gpus
        return after <= self._quota[key].guaranteed_gpus

    def mark_leaving(self, key: QuotaKey, gpus: int) -> None:
        self._leaving[key] += gpus
        if self._leaving[key] < 0:
            raise AssertionError(f"leaving GPUs of {key} went negative")

    def mark_arriving(self, key: QuotaKey, gpus: int) -> None:
        self._arriving[key] += gpus
        if self._arriving[key] < 0:
            raise AssertionError(f"arriving GPUs of {key} went negative")

    def _floor(self, key: QuotaKey, usage: int) -> int:
        quota = self._quota[key]
        lendable = (
            quota.guaranteed_gpus
            if quota.lending_limit_gpus is None
            else min(quota.guaranteed_gpus, quota.lending_limit_gpus)
        )
        return max(usage, quota.guaranteed_gpus - lendable)

    def check(
        self,
        key: QuotaKey,
        gpus: int,
        capacity: int,
        may_borrow: bool,
        freed: Mapping[QuotaKey, int] = _NOTHING_FREED,
    ) -> Admission:
        """May `gpus` more be charged to `key` on a cluster of `capacity` GPUs, once `freed`
        GPUs (its preemption victims', per quota entry) have left?"""
        quota = self._quota[key]
        after = self._usage[key] - freed.get(key, 0) + gpus
        if after <= quota.guaranteed_gpus:
            if self._cohorts is None:
                return Admission(True, False)
            breach = self._cohort_breach(key, after, freed)
            if breach is None:
                return Admission(True, False)
            return Admission(False, False, breach.describe(), reclaim=True, cohort=breach.cohort)
        if not may_borrow:
            return Admission(False, True, "over guarantee and may not borrow")
        if quota.borrowing_limit_gpus is not None and (after - quota.guaranteed_gpus > quota.borrowing_limit_gpus):
            return Admission(False, True, "borrowing limit")
        if self._cohorts is not None:
            return self._check_cohorts(key, after, capacity, freed)
        kept = self._kept_back[quota.gpu_type] - self._floor(key, self._usage[key]) + self._floor(key, max(0, after))
        for other, gpus_freed in freed.items():
            if other != key and self._quota[other].gpu_type == quota.gpu_type:
                # victims of other entries of its type give back what they kept
                usage = self._usage[other]
                kept += self._floor(other, usage - gpus_freed) - self._floor(other, usage)
        if kept > capacity:
            return Admission(False, True, NO_LENDABLE_CAPACITY)
        return Admission(True, True)

    def _footprint_deltas(self, key: QuotaKey, after: int, freed: Mapping[QuotaKey, int]) -> dict[QuotaKey, int]:
        """How the entries' footprints move if `key` goes to `after` and `freed` leave (victims
        of other GPU types free nothing of this one)."""
        gpu_type = self._quota[key].gpu_type
        deltas = {key: self._floor(key, max(0, after)) - self._floor(key, self._usage[key])}
        for other, gpus_freed in freed.items():
            if other != key and self._quota[other].gpu_type == gpu_type:
                usage = self._usage[other]
                deltas[other] = self._floor(other, usage - gpus_freed) - self._floor(other, usage)
        return deltas

    def _cohort_breach(self, key: QuotaKey, after: int, freed: Mapping[QuotaKey, int]) -> CohortBreach | None:
        assert self._cohorts is not None
        _, breach = self._cohorts.after(self._footprint_deltas(key, after, freed))
        return breach

    def _check_cohorts(self, key: QuotaKey, after: int, capacity: int, freed: Mapping[QuotaKey, int]) -> Admission:
        assert self._cohorts is not None
        moved, breach = self._cohorts.after(self._footprint_deltas(key, after, freed))
        if breach is not None:
            return Admission(False, True, breach.describe())
        if self._kept_back.get(self._quota[key].gpu_type, 0) + moved > capacity:
            return Admission(False, True, NO_LENDABLE_CAPACITY)
        return Admission(True, True)

    def members(self, cohort: str) -> frozenset[QuotaKey]:
        """The quota entries under `cohort`, at any depth."""
        if self._cohorts is None:
            return frozenset()
        return frozenset(k for k in self._quota if cohort in self._cohorts.ancestors(k))

    def cohort_borrowed(self, cohort: str, gpu_type: str = "") -> int:
        """GPUs of `gpu_type` a cohort's members use from outside it."""
        return 0 if self._cohorts is None else self._cohorts.borrowed((cohort, gpu_type))

    def cohort_totals(self, cohort: str, gpu_type: str) -> tuple[int, int, int | None]:
        """(guarantee, borrowed from outside, borrowing limit) of a cohort for one GPU type."""
        if self._cohorts is None:
            raise KeyError(f"no cohort {cohort!r}: the policy declares none")
        cell = (cohort, gpu_type)
        return self._cohorts.guarantee(cell), self._cohorts.borrowed(cell), self._cohorts.limit(cell)

    def _move_footprint(self, key: QuotaKey, delta: int) -> None:
        if self._cohorts is not None:
            delta = self._cohorts.apply(key, delta)
        gpu_type = self._quota[key].gpu_type
        self._kept_back[gpu_type] = self._kept_back.get(gpu_type, 0) + delta

    def charge(self, key: QuotaKey, gpus: int) -> None:
        before = self._usage[key]
        after = before + gpus
        if after < 0:
            raise AssertionError(f"quota usage of {key} would go negative ({after})")
        moved = self._floor(key, after) - self._floor(key, before)
        if moved:
            self._move_footprint(key, moved)
        self._usage[key] = after
