"""What an operator's status page prints: per team, per node group, every lease, and every
pending workload with the reason it waits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.scheduler.core.fairshare import DecayedUsage
from switchyard.scheduler.core.model import Lease, PendingWorkload
from switchyard.scheduler.core.pending import PendingExplanation
from switchyard.scheduler.core.placement import NodePool
from switchyard.scheduler.core.policy import SchedulerPolicy
from switchyard.scheduler.core.quota import QuotaBook


@dataclass(frozen=True, slots=True)
class TeamStatus:
    team: str
    guaranteed_gpus: int
    used_gpus: int
    borrowed_gpus: int
    fair_share: float
    decayed_gpus: float
    queued: int
    queued_gpus: int
    oldest_wait_s: float
    preempting: int


@dataclass(frozen=True, slots=True)
class PoolStatus:
    node_group: str
    nodes: int
    gpus: int
    free_gpus: int
    reserved_gpus: int
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class CohortStatus:
    """One cohort's GPUs of one type: its members' guarantees, what they borrow from outside
    it, and the most they may (None: no limit)."""

    cohort: str
    gpu_type: str
    guaranteed_gpus: int
    borrowed_gpus: int
    borrowing_limit_gpus: int | None


@dataclass(frozen=True, slots=True)
class LeaseStatus:
    lease_id: str
    team: str
    priority_class: str
    gpus: int
    state: str
    started_at: float
    nodes: tuple[str, ...]
    borrowing: bool


@dataclass(frozen=True, slots=True)
class PendingStatus:
    workload_id: str
    team: str
    priority_class: str
    gpus: int
    waited_s: float
    """Since submission (all attempts)."""
    reason: str
    """A `core.pending.PendingReason` value: quota, capacity, gang fit, reservation, ..."""
    detail: str


@dataclass(frozen=True, slots=True)
class ClusterSnapshot:
    now: float
    total_gpus: int
    free_gpus: int
    teams: tuple[TeamStatus, ...]
    pools: tuple[PoolStatus, ...]
    leases: tuple[LeaseStatus, ...]
    reservations: tuple[tuple[str, tuple[tuple[str, int], ...]], ...]
    pending: tuple[PendingStatus, ...] = ()
    """In queue order per priority level."""
    cohorts: tuple[CohortStatus, ...] = ()


def build_snapshot(
    policy: SchedulerPolicy,
    pool: NodePool,
    book: QuotaBook,
    usage: DecayedUsage,
    leases: Mapping[str, Lease],
    pending: list[PendingWorkload],
    explained: list[tuple[PendingWorkload, PendingExplanation]] | None,
    reserved: Mapping[str, Mapping[str, int]],
    now: float,
) -> ClusterSnapshot:
    """`explained`: each pending workload with its reason, or None to leave the per-workload
    rows out (they cost a placement search each; the gauges exported every tick need none)."""
    teams = []
    for team in policy.teams:
        mine = [p for p in pending if p.request.team == team.name]
        keys = [(team.name, i) for i in range(len(team.quotas))]
        teams.append(
            TeamStatus(
                team=team.name,
                guaranteed_gpus=team.guaranteed_gpus,
                used_gpus=book.team_usage(team.name),
                borrowed_gpus=sum(book.borrowed(k) for k in keys),
                fair_share=round(usage.share(team.name, now), 4),
                decayed_gpus=round(usage.decayed_gpus(team.name, now), 2),
                queued=len(mine),
                queued_gpus=sum(p.request.gpus for p in mine),
                oldest_wait_s=max((now - p.submitted_at for p in mine), default=0.0),
                preempting=sum(
                    1
                    for lease in leases.values()
                    if lease.request.team == team.name and lease.state.value == "preempting"
                ),
            )
        )
    held: dict[str, int] = {}
    for amounts in reserved.values():
        for node, gpus in amounts.items():
            held[node] = held.get(node, 0) + gpus
    groups: dict[str, list[str]] = {}
    for spec in pool.nodes():
        groups.setdefault(spec.node_group, []).append(spec.name)
    pools = tuple(
        PoolStatus(
            node_group=g,
            nodes=len(names),
            gpus=sum(pool.node(n).gpus for n in names),
            free_gpus=sum(pool.free(n) for n in names),
            reserved_gpus=sum(held.get(n, 0) for n in names),
            gpu_type=pool.group_type(g),
        )
        for g, names in sorted(groups.items())
    )
    lease_rows = tuple(
        LeaseStatus(
            x.lease_id,
            x.request.team,
            x.request.priority_class,
            x.gpus,
            x.state.value,
            x.started_at,
            x.placement,
            x.borrowing,
        )
        for x in sorted(leases.values(), key=lambda x: x.lease_id)
    )
    return ClusterSnapshot(
        now=now,
        total_gpus=pool.total_gpus,
        free_gpus=pool.free_gpus,
        teams=tuple(teams),
        pools=pools,
        leases=lease_rows,
        reservations=tuple((w, tuple(sorted(r.items()))) for w, r in sorted(reserved.items())),
        pending=() if explained is None else tuple(_pending_status(p, why, now) for p, why in explained),
        cohorts=tuple(
            CohortStatus(c.name, t, *book.cohort_totals(c.name, t))
            for c in policy.cohorts
            for t in policy.request_types
        ),
    )


def _pending_status(pending: PendingWorkload, why: PendingExplanation, now: float) -> PendingStatus:
    request = pending.request
    return PendingStatus(
        request.workload_id,
        request.team,
        request.priority_class,
        request.gpus,
        now - pending.submitted_at,
        why.reason.value,
        why.detail,
    )
