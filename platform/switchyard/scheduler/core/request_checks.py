"""What makes a gang request acceptable to a policy, checked once at submit or adopt: its team,
priority class, workload class and GPU types are the policy's, and its bundles are GPUs."""

from __future__ import annotations

from collections.abc import Callable

from switchyard.scheduler.core.model import GangRequest
from switchyard.scheduler.core.policy import SchedulerPolicy


def check_request(
    request: GangRequest, policy: SchedulerPolicy, typed: bool, types: Callable[[], tuple[str, ...]]
) -> None:
    """Raises ValueError naming the workload and what is wrong. `typed`: the policy declares GPU
    types; `types()`: the types the request may run on (the scheduler's answer, asked only once
    the team is known; empty when its team has no quota of its class for any)."""
    workload = request.workload_id
    try:
        team = policy.team(request.team)
        policy.priority(request.priority_class)
        if not typed:
            team.quota_index(request.workload_class)
    except KeyError as err:
        raise ValueError(f"workload {workload!r}: {err.args[0]}") from None
    if request.gpu_types:
        if not typed:
            raise ValueError(
                f"workload {workload!r}: asks for GPU types {list(request.gpu_types)}, but the policy declares none"
            )
        unknown = [t for t in request.gpu_types if t not in policy.gpu_types]
        if unknown:
            raise ValueError(f"workload {workload!r}: unknown GPU types {unknown}")
    if not types():
        raise ValueError(
            f"workload {workload!r}: team {request.team!r} has no quota for workload class "
            f"{request.workload_class!s} of GPU types {list(request.gpu_types or policy.gpu_types)}"
        )
    if not request.bundles or min(request.bundles) <= 0:
        raise ValueError(f"workload {workload!r}: bundles must be positive GPU counts, got {request.bundles}")
