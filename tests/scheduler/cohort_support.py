"""A two-level cohort tree over two GPU types, and the oracle that checks its limits from the
leases alone: shared by the cohort tests and the knob property test."""

from __future__ import annotations

from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    Lease,
    Node,
    PolicyKnobs,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.core.policy import Cohort, CohortLimits, PriorityClass

RESEARCH = frozenset({WorkloadClass.TRAINING, WorkloadClass.BATCH_FINE_TUNE, WorkloadClass.EXPLORATORY})
INFERENCE = frozenset({WorkloadClass.INFERENCE})
TYPES = ("h100", "a100")


def tree_policy(
    knobs: PolicyKnobs | None = None, classes: tuple[PriorityClass, ...] = DEFAULT_PRIORITY_CLASSES
) -> SchedulerPolicy:
    """org -> {research -> {ra, rb}, product -> {pa}}; inference outside the tree."""

    def limits(
        h100: tuple[int | None, int | None], a100: tuple[int | None, int | None]
    ) -> tuple[tuple[str, CohortLimits], ...]:
        return (("h100", CohortLimits(*h100)), ("a100", CohortLimits(*a100)))

    cohorts = (
        Cohort("org", None, limits((8, None), (None, None))),
        Cohort("research", "org", limits((4, None), (8, None))),
        Cohort("product", "org", limits((0, 4), (16, None))),
    )

    def team(name: str, h100: int, a100: int, cohort: str) -> Team:
        quotas = (Quota(RESEARCH, h100, None, None, "h100"), Quota(RESEARCH, a100, 8, None, "a100"))
        return Team(name, quotas, float(h100 + a100), cohort)

    teams = (
        team("ra", 8, 8, "research"),
        team("rb", 8, 0, "research"),
        team("pa", 8, 8, "product"),
        Team("inf", (Quota(INFERENCE, 8, 0, None, "h100"),), 8.0),
    )
    return SchedulerPolicy(classes, teams, knobs or PolicyKnobs(), TYPES, cohorts)


def tree_nodes() -> list[Node]:
    """h100: 6 nodes (48 GPUs) in 3 groups; a100: 4 nodes (32 GPUs) in 2 groups."""
    out = []
    for t, count in (("h100", 6), ("a100", 4)):
        out += [Node(f"{t}-{i}", 8, f"{t}-g{i // 2}", f"{t}-r{i // 2}", t) for i in range(count)]
    return out


def cohort_borrowing(policy: SchedulerPolicy, leases: list[Lease], gpu_type: str) -> dict[str, int]:
    """Each cohort's borrowing from outside it, recomputed from the leases (the oracle):
    footprint(entry) = max(usage, guarantee - lendable); footprint(cohort) = max(sum of its
    members', its guarantee - its lending limit); borrowing = sum of members' - guarantee."""
    usage: dict[tuple[str, int], int] = {}
    for lease in leases:
        if lease.gpu_type == gpu_type:
            team = policy.team(lease.request.team)
            key = (team.name, team.quota_index(lease.request.workload_class, gpu_type))
            usage[key] = usage.get(key, 0) + lease.gpus

    def entry_footprint(team: Team, i: int) -> int:
        quota = team.quotas[i]
        kept = 0 if quota.lending_limit_gpus is None else max(0, quota.guaranteed_gpus - quota.lending_limit_gpus)
        return max(usage.get((team.name, i), 0), kept)

    def of(cohort: Cohort) -> tuple[int, int, int]:  # (guarantee, members' footprints, footprint)
        guarantee = inner = 0
        for team in policy.teams:
            if team.cohort == cohort.name:
                for i, quota in enumerate(team.quotas):
                    if quota.gpu_type == gpu_type:
                        guarantee += quota.guaranteed_gpus
                        inner += entry_footprint(team, i)
        for child in policy.cohorts:
            if child.parent == cohort.name:
                g, _, f = of(child)
                guarantee += g
                inner += f
        lending = cohort.limits_for(gpu_type).lending_limit_gpus
        kept = 0 if lending is None else max(0, guarantee - lending)
        return guarantee, inner, max(inner, kept)

    out = {}
    for cohort in policy.cohorts:
        guarantee, inner, _ = of(cohort)
        out[cohort.name] = inner - guarantee
    return out


def check_invariants(s: Scheduler, seed: int) -> None:
    policy = s.policy
    leases = list(s.leases().values())
    for gpu_type in TYPES:
        borrowed = cohort_borrowing(policy, leases, gpu_type)
        for cohort in policy.cohorts:
            limit = cohort.limits_for(gpu_type).borrowing_limit_gpus
            assert limit is None or borrowed[cohort.name] <= limit, (
                f"seed {seed}: cohort {cohort.name} borrows {borrowed[cohort.name]} {gpu_type} GPUs, limit {limit}"
            )
        on_type = sum(x.gpus for x in leases if x.gpu_type == gpu_type)
        assert on_type <= s.pool.type_gpus(gpu_type), f"seed {seed}: {on_type} {gpu_type} GPUs leased"
    for team in policy.teams:
        for i, quota in enumerate(team.quotas):
            used = sum(
                x.gpus
                for x in leases
                if x.request.team == team.name
                and x.gpu_type == quota.gpu_type
                and team.quota_index(x.request.workload_class, x.gpu_type) == i
            )
            if quota.borrowing_limit_gpus is not None:
                assert used <= quota.guaranteed_gpus + quota.borrowing_limit_gpus, (
                    f"seed {seed}: team {team.name} uses {used} {quota.gpu_type} GPUs past its quota"
                )
    for x in leases:
        assert x.gpu_type in (x.request.gpu_types or TYPES), f"seed {seed}: {x.lease_id} on {x.gpu_type}"
        assert {s.pool.node(n).gpu_type for n in x.placement} == {x.gpu_type}, f"seed {seed}: {x.lease_id}"
