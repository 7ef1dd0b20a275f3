"""When the live scheduler runs a scheduling pass: on change, at a deadline, and no more.

A pass (`Scheduler.schedule`) costs milliseconds at 10,000 GPUs and, in the live actor, one
write-ahead-log record. Like the simulator (`sim.engine`: a pass after each batch of events,
and a wake-up at every notice's deadline), the driver passes only when one could decide
something new:

- an event other than a tick was applied since the last pass (a submit, a release, a node, a
  checkpoint, a cordon, a Serve replica, ...);
- a notice's grace period is over (its lease is stopped by the pass);
- a grant has been unclaimed past the claim timeout (the pass takes it back);
- a finished workload has outlived the retention period (the pass forgets it);
- workloads are queued and `idle_pass_s` has gone by: the core's clock-driven rules (queue
  aging, the end of a lease's min-runtime protection, the back-off between victim searches)
  take effect at most that late, where the simulator would see them at the next event.

With nothing queued, no notice out and no grant waiting for its claim, a tick is free. The
trigger is derived state: a restarted driver passes on its first tick.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from switchyard.scheduler.claims import ClaimPolicy
from switchyard.scheduler.core import WorkloadClass
from switchyard.scheduler.driver.state import LiveState

IDLE_PASS_S = 2.0


@dataclass(slots=True)
class PassTrigger:
    idle_pass_s: float = IDLE_PASS_S
    dirty: bool = True
    last_pass: float = -math.inf

    def changed(self) -> None:
        self.dirty = True

    def passed(self, now: float) -> None:
        self.dirty = False
        self.last_pass = now

    def due(self, state: LiveState, now: float, claims: ClaimPolicy, retention_s: float) -> bool:
        if self.dirty:
            return True
        if state.core.pending_count() and now - self.last_pass >= self.idle_pass_s:
            return True
        if _grace_over(state, now):
            return True
        if _claim_overdue(state, now, claims):
            return True
        oldest_finished = next(iter(state.finished_at.values()), None)  # the dict is in time order
        return oldest_finished is not None and oldest_finished < now - retention_s


def _grace_over(state: LiveState, now: float) -> bool:
    """A lease the driver put under notice is past its stop deadline."""
    for workload in state.notices:
        lease = state.core.lease_of(workload)
        if lease is not None and lease.stop_deadline is not None and lease.stop_deadline <= now:
            return True
    return False


def _claim_overdue(state: LiveState, now: float, claims: ClaimPolicy) -> bool:
    for workload, grant in state.grants.items():
        if workload in state.claims or now - grant.granted_at <= claims.timeout_s:
            continue
        sub = state.submissions.get(workload)
        if sub is not None and sub.workload_class is not WorkloadClass.INFERENCE:
            return True
    return False
