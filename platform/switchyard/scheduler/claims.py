"""Claim timeouts: a grant nobody started using does not hold its GPUs for ever.

A training workload's job claims its lease when it starts (`cluster.admission`). If the launch
was lost (the Jobs API call failed after the grant was saved, the job died before claiming, a
caller that polled for its lease went away), nothing would ever release the grant. After
`timeout_s` unclaimed, the live scheduler takes the GPUs back and requeues the workload; after
`max_timeouts` such requeues in a row it ends the workload, so a launch that can never work
does not loop. Serve's replicas (inference) are placed, not claimed: they are exempt.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

from switchyard.scheduler.api import LeaseGrant


class ClaimOutcome(Enum):
    REQUEUE = "requeue"
    END = "end"


CLAIM_TIMEOUT_S = 600.0  # a launch pulls its runtime env and starts Ray Train: minutes, not hours


@dataclass(frozen=True, slots=True)
class ClaimPolicy:
    timeout_s: float = CLAIM_TIMEOUT_S
    max_timeouts: int = 3


def unclaimed(
    grants: Mapping[str, LeaseGrant],
    claims: Mapping[str, str],
    needs_claim: Callable[[str], bool],
    now: float,
    policy: ClaimPolicy,
) -> list[str]:
    """Workloads whose grant is older than the timeout and still unclaimed, oldest first."""
    late = [
        grant
        for workload, grant in grants.items()
        if workload not in claims and needs_claim(workload) and now - grant.granted_at > policy.timeout_s
    ]
    return [g.workload_id for g in sorted(late, key=lambda g: (g.granted_at, g.workload_id))]


def after_timeout(timeouts_so_far: int, policy: ClaimPolicy) -> ClaimOutcome:
    """What to do with a workload whose grant just timed out for the `timeouts_so_far + 1`th time."""
    return ClaimOutcome.END if timeouts_so_far + 1 >= policy.max_timeouts else ClaimOutcome.REQUEUE
