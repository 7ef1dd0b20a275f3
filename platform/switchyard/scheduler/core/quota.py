"""Quota accounting: GPUs in use per (team, quota), guarantees, borrowing and lending limits.

A quota entry's owner may always use its guarantee. Above it, it borrows: at most its
borrowing limit, and only from capacity that no other entry has kept back (each entry keeps
back the part of its unused guarantee it does not lend).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

from switchyard.scheduler.core.model import WorkloadClass
from switchyard.scheduler.core.policy import Quota, Team

QuotaKey = tuple[str, int]  # (team, index of the quota entry in Team.quotas)
# The one refusal that more GPUs would lift: borrowing is capped by what the cluster can lend.
NO_LENDABLE_CAPACITY = "no lendable capacity"
_NOTHING_FREED: Mapping[QuotaKey, int] = MappingProxyType({})


@dataclass(frozen=True, slots=True)
class Admission:
    allowed: bool
    borrowing: bool
    reason: str = ""


class QuotaBook:
    def __init__(self, teams: tuple[Team, ...]) -> None:
        self._teams = {t.name: t for t in teams}
        self._quota: dict[QuotaKey, Quota] = {(t.name, i): q for t in teams for i, q in enumerate(t.quotas)}
        self._usage: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)
        self._keys: dict[tuple[str, WorkloadClass], QuotaKey] = {}
        self._kept_back = sum(self._floor(k, 0) for k in self._quota)
        # Two-phase preemption: GPUs still held by noticed victims will leave their entry, and
        # GPUs freed for a waiting preemptor will join its entry; both count as already moved
        # so that two preemptors never take the same borrowed GPUs or over-reclaim.
        self._leaving: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)
        self._arriving: dict[QuotaKey, int] = dict.fromkeys(self._quota, 0)

    def key(self, team: str, workload_class: WorkloadClass) -> QuotaKey:
        found = self._keys.get((team, workload_class))
        if found is None:
            found = (team, self._teams[team].quota_index(workload_class))
            self._keys[(team, workload_class)] = found
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
            return Admission(True, False)
        if not may_borrow:
            return Admission(False, True, "over guarantee and may not borrow")
        if quota.borrowing_limit_gpus is not None and (after - quota.guaranteed_gpus > quota.borrowing_limit_gpus):
            return Admission(False, True, "borrowing limit")
        kept = self._kept_back - self._floor(key, self._usage[key]) + self._floor(key, max(0, after))
        for other, gpus_freed in freed.items():
            if other != key:  # victims of other entries give back what they kept
                usage = self._usage[other]
                kept += self._floor(other, usage - gpus_freed) - self._floor(other, usage)
        if kept > capacity:
            return Admission(False, True, NO_LENDABLE_CAPACITY)
        return Admission(True, True)

    def charge(self, key: QuotaKey, gpus: int) -> None:
        before = self._usage[key]
        after = before + gpus
        if after < 0:
            raise AssertionError(f"quota usage of {key} would go negative ({after})")
        self._kept_back += self._floor(key, after) - self._floor(key, before)
        self._usage[key] = after
