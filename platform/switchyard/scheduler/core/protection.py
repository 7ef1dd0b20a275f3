"""How long a running lease is protected from preemption: minimum runtimes and backoff.

Rules (pure; docs/scheduler.md, "Preemption: who may be a victim"):
  * priority preemption waits for the victim class's `min_runtime_s`, reclaim for its
    `reclaim_min_runtime_s`, both counted from the lease's start;
  * a workload preempted n times before is protected from both for
    `preemption_backoff_s x 2^(n-1)` (at most `max_preemption_backoff_s`) from its start, so a
    just-restarted job is not the cheapest victim again and again;
  * a workload preempted `max_preemptions` times is *settled* (`is_settled`): no longer a
    victim of priority preemption or of a team's reclaim, and of inference reclaim only as
    described in `core.settled`;
  * inference reclaiming its guarantee ignores both (applied where victims are judged,
    `preemption.py`): its GPUs come back within one grace period, which keeps inference
    inside its SLO bound.
"""

from __future__ import annotations

from switchyard.scheduler.core.model import Lease, PreemptionReason
from switchyard.scheduler.core.policy import PriorityClass

_MAX_DOUBLINGS = 32  # 2^32 x any sane base is past every cap: stops the float growing


def backoff_s(priority: PriorityClass, preemptions: int) -> float:
    """Protection after `preemptions` earlier preemptions of the same workload."""
    base = priority.preemption_backoff_s
    if preemptions <= 0 or base <= 0:
        return 0.0
    cap = max(priority.max_preemption_backoff_s, base)
    return min(base * 2.0 ** min(preemptions - 1, _MAX_DOUBLINGS), cap)


def protected_until(lease: Lease, priority: PriorityClass, reason: PreemptionReason) -> float:
    """The earliest time `lease` may be preempted for `reason` (not by inference reclaim)."""
    floor = priority.min_runtime_s if reason is PreemptionReason.PRIORITY else priority.reclaim_min_runtime_s
    return lease.started_at + max(floor, backoff_s(priority, lease.prior_preemptions))


def is_settled(priority: PriorityClass, preemptions: int) -> bool:
    """Whether a workload preempted `preemptions` times has reached its class's cap."""
    cap = priority.max_preemptions
    return cap is not None and preemptions >= cap
