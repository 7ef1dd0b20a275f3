"""Fair-share reclaim among borrowers: when a borrowing gang may take another borrower's lease.

The rule is Kueue's fair-sharing preemption strategy `LessThanOrEqualToFinalShare`
(kueue apis/config/v1beta1/configuration_types.go, `FairSharing.PreemptionStrategies`):
"Only preempt a workload if the share of the preemptor CQ with the preemptor workload is less
than or equal to the share of the preemptee CQ without the workload to be preempted." A share
is, as in Kueue, what a quota entry borrows above its guarantee over its team's weight; here in
GPUs, the one resource, and counted after the preemptions already under way (GPUs leaving and
arriving), so two preemptors in flight never both overshoot.

Hysteresis: the preemptor's share plus a margin (GPUs) must stay at or below the victim's share.
Afterwards the victim's team, asking back with a gang of g GPUs, would have share at least
`s_victim + g` against the preemptor's at most `s_victim - margin - g'`: the rule refuses it, so
a lease cannot ping-pong between two teams unless their other work moves the shares by more
than the margin plus both gangs. The victims' protection (minimum runtime and the per-workload
backoff, `protection.py`) bounds the rest.
"""

from __future__ import annotations

from collections.abc import Mapping

from switchyard.scheduler.core.quota import QuotaBook, QuotaKey


class FairShares:
    """Borrowed-GPU shares of quota entries, as `QuotaBook` has them now."""

    def __init__(self, book: QuotaBook, weights: Mapping[str, float], margin_gpus: float) -> None:
        self._book = book
        self._weight = {team: max(w, 1e-9) for team, w in weights.items()}  # weight 0: share infinite, as Kueue
        self._margin = margin_gpus

    def share(self, key: QuotaKey, gpus: int = 0) -> float:
        """The entry's share once `gpus` more (negative: fewer) are charged to it."""
        return self._book.borrowing_after(key, gpus) / self._scale(key)

    def _scale(self, key: QuotaKey) -> float:
        # Borrowed GPUs per guaranteed GPU (KAI's proportional share): in absolute GPUs every
        # large team, borrowing more, would be the victim of every small one.
        return self._weight[key[0]] * max(1, self._book.quota(key).guaranteed_gpus)

    def bar(self, key: QuotaKey, gpus: int) -> float:
        """The share a victim's entry must keep after losing its lease for a borrowing gang of
        `gpus` GPUs of entry `key` to take it: the preemptor's share after admission plus the
        margin."""
        return self.share(key, gpus) + self._margin / self._scale(key)

    def allows(self, bar: float, victim_key: QuotaKey, gpus_taken: int) -> bool:
        """Whether the victim's entry, after losing `gpus_taken` GPUs, keeps a share of at
        least `bar` (LessThanOrEqualToFinalShare with the margin)."""
        return self.share(victim_key, -gpus_taken) >= bar
