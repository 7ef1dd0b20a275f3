"""Which GPU types a request may run on, and in which order they are tried (resource flavors).

Pure functions over the policy; the scheduler keeps the cache `request_types` fills (its keys
are a team, a class and the types a request names, so it stays small).
"""

from __future__ import annotations

from dataclasses import replace

from switchyard.scheduler.core.model import GangRequest, WorkloadClass
from switchyard.scheduler.core.policy import SchedulerPolicy, WhenCanBorrow
from switchyard.scheduler.core.quota import Admission

TypesCache = dict[tuple[str, WorkloadClass, tuple[str, ...]], tuple[str, ...]]


def request_types(policy: SchedulerPolicy, request: GangRequest, cache: TypesCache) -> tuple[str, ...]:
    """The GPU types `request` may run on, first choice first: those it names (or the policy's,
    when it names none) that its team has a quota of its class for."""
    cache_key = (request.team, request.workload_class, request.gpu_types)
    found = cache.get(cache_key)
    if found is None:
        team = policy.team(request.team)
        wanted = request.gpu_types or policy.request_types
        found = tuple(t for t in wanted if team.has_quota(request.workload_class, t))
        cache[cache_key] = found
    return found


def on_type(request: GangRequest, gpu_type: str, typed: bool) -> GangRequest:
    """`request` as tried on one GPU type (what a victim search is told)."""
    if not typed or request.gpu_types == (gpu_type,):
        return request
    return replace(request, gpu_types=(gpu_type,))


def fit_order(admissions: list[tuple[str, Admission]], when_can_borrow: WhenCanBorrow) -> list[tuple[str, Admission]]:
    """The order to try GPU types in: the request's own, or under `try-next-type` every type
    within its guarantee before any it would borrow on (Kueue's whenCanBorrow)."""
    if when_can_borrow is WhenCanBorrow.BORROW or len(admissions) == 1:
        return admissions
    return sorted(admissions, key=lambda ta: ta[1].borrowing)
