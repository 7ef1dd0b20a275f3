"""Settled workloads: a cap on how often one workload is preempted.

Rules (pure; docs/scheduler.md, "Preemption: who may be a victim"):
  * a workload preempted `max_preemptions` times (its priority class's cap) is *settled*
    (`protection.is_settled`): its leases are never again taken by priority preemption,
    fair-share reclaim, escalation or a team reclaiming its guarantee;
  * a settled lease whose GPUs fit, with the entry's immune leases, within its quota entry's
    guarantee is *immune*: no one's victim, inference reclaim included. Every entry then holds
    at least what it borrows in leases inference may still take (used - immune >= used -
    guarantee), so inference, reclaiming its pool, finds as many victim GPUs as without the
    cap; an exposed lease (below) becomes immune, oldest first, when an immune one of its entry
    ends and it fits;
  * a reservation counts immune GPUs as held (`pinned`): no victim search can clear them, and
    a gang that reserved a node beside a long immune lease waited for it to end;
  * the others (the entry's guarantee is full of immune leases, or the gang alone is larger
    than the guarantee) are *inference's last resort*: taken only by inference reclaim, and
    only when no plan without them frees the GPUs (`victim_index.LAST_RESORT_S`), so the SLO
    bound stays one grace period; a team reclaiming its guarantee waits for them to end.
    Holding a settled workload back until its guarantee had room instead made team 7f04ca's
    settled 8-GPU gangs queue behind each other for its 57 GPUs on October at 672 GPUs (p99
    275k -> 1.6 M s); letting team reclaim take them too left one job at 9 preemptions.
"""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.scheduler.core.model import Lease
from switchyard.scheduler.core.quota import QuotaBook, QuotaKey


class SettledLeases:
    """The running settled leases per quota entry, as `QuotaBook` keys them: the immune ones
    (and their GPUs), and the others, which become immune, oldest first, as immune ones end
    and make room (so few stay exposed for long)."""

    def __init__(self, book: QuotaBook) -> None:
        self._book = book
        self._gpus: dict[QuotaKey, int] = {}
        self._leases: dict[str, tuple[QuotaKey, Lease]] = {}
        self._by_node: dict[str, int] = {}  # node -> immune GPUs on it
        self._waiting: dict[QuotaKey, dict[str, Lease]] = {}  # settled, not immune, in start order

    def __contains__(self, lease_id: object) -> bool:
        """Whether `lease_id` is an immune lease."""
        return lease_id in self._leases

    def expose(self, lease: Lease, key: QuotaKey) -> None:
        """A settled lease that does not fit: exposed (inference's last resort) until it does."""
        self._waiting.setdefault(key, {})[lease.lease_id] = lease

    def unexpose(self, lease: Lease, key: QuotaKey) -> None:
        """An exposed lease stopped running (noticed or released)."""
        waiting = self._waiting.get(key)
        if waiting is not None and waiting.pop(lease.lease_id, None) is not None and not waiting:
            del self._waiting[key]

    def fits(self, key: QuotaKey, gpus: int) -> bool:
        """Whether a settled lease of `gpus` GPUs of entry `key` runs immune: the entry's
        immune GPUs, its own included, stay within the guarantee."""
        return self._gpus.get(key, 0) + gpus <= self._book.quota(key).guaranteed_gpus

    def add(self, lease: Lease, key: QuotaKey) -> None:
        self._leases[lease.lease_id] = (key, lease)
        self._gpus[key] = self._gpus.get(key, 0) + lease.gpus
        for node, gpus in lease.gpus_by_node().items():
            self._by_node[node] = self._by_node.get(node, 0) + gpus

    def remove(self, lease_id: str) -> list[Lease]:
        """An immune lease stopped running; returns the exposed leases of its entry that now
        fit and have become immune (the caller takes them out of the victim index)."""
        key, lease = self._leases.pop(lease_id)
        self._gpus[key] -= lease.gpus
        if not self._gpus[key]:
            del self._gpus[key]
        for node, gpus in lease.gpus_by_node().items():
            self._by_node[node] -= gpus
            if not self._by_node[node]:
                del self._by_node[node]
        promoted = [w for w in self._waiting.get(key, {}).values() if self._promote(w, key)]
        for w in promoted:
            self.unexpose(w, key)
        return promoted

    def _promote(self, lease: Lease, key: QuotaKey) -> bool:
        if not self.fits(key, lease.gpus):
            return False
        self.add(lease, key)
        return True

    def pinned(self, held: Mapping[str, int]) -> Mapping[str, int]:
        """`held` plus the immune GPUs on each node: what a reservation cannot expect to see
        freed (victims may free the rest)."""
        if not self._by_node:
            return held
        out = dict(held)
        for node, gpus in self._by_node.items():
            out[node] = out.get(node, 0) + gpus
        return out

    def immune_on(self, node: str) -> int:
        """Immune GPUs on `node` (what `pinned` adds there)."""
        return self._by_node.get(node, 0)

    def gpus(self, key: QuotaKey) -> int:
        return self._gpus.get(key, 0)
