"""The policy as data: priority classes, teams and their quotas, and the knobs that select
an admission order and a preemption rule. Baselines are other values of the same knobs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from switchyard.scheduler.core.model import WorkloadClass


class Ordering(StrEnum):
    FIFO = "fifo"  # submit order only
    PRIORITY = "priority"  # priority, then submit order
    FAIR_SHARE = "fair-share"  # priority, then weighted decayed share, then submit order


class WhenCanBorrow(StrEnum):
    """Which GPU type a request takes when its first choice would have it borrow (Kueue's
    `flavorFungibility.whenCanBorrow`, apis/kueue/v1beta1/clusterqueue_types.go)."""

    BORROW = "borrow"  # Kueue's default: borrow in the current type before trying the next
    TRY_NEXT_TYPE = "try-next-type"  # every type within its guarantee first, then borrowing


class PreemptionMode(StrEnum):
    NONE = "none"
    PRIORITY = "priority"  # lower-priority preemptible victims, no quota protection
    KUEUE = "kueue"  # reclaim borrowed quota + lower priority; lowest priority, newest first
    CHECKPOINT_AWARE = "checkpoint-aware"  # kueue's rules; fewest GPU-seconds lost first


@dataclass(frozen=True, slots=True)
class PriorityClass:
    name: str
    value: int
    preemptible: bool
    min_runtime_s: float = 0.0
    """Protects a lease from priority preemption until it has run this long."""
    reclaim_min_runtime_s: float = 0.0
    """Protects a lease on borrowed GPUs from reclaim until it has run this long (inference
    reclaim excepted); 0 keeps reclaim immediate."""
    preemption_backoff_s: float = 0.0
    """After its n-th preemption a workload's next lease is protected from every preemption
    but inference reclaim for backoff x 2^(n-1) seconds from its start (victim thrash)."""
    max_preemption_backoff_s: float = 0.0
    """Cap of that protection (at least `preemption_backoff_s`), which bounds how long a
    reclaim may have to wait for a backed-off borrower."""
    max_preemptions: int | None = None
    """After this many preemptions a workload is *settled* (`core.settled`): never again taken
    by priority preemption or a team's reclaim; immune to inference reclaim too while its quota
    entry's immune GPUs fit the guarantee, and inference's last resort beyond. None: no cap."""


@dataclass(frozen=True, slots=True)
class Quota:
    """One team's share of GPUs for a set of workload classes."""

    classes: frozenset[WorkloadClass]
    guaranteed_gpus: int
    borrowing_limit_gpus: int | None = None
    """Most GPUs above the guarantee it may borrow; None = no limit."""
    lending_limit_gpus: int | None = None
    """Most of its unused guarantee others may borrow; None = all of it."""
    gpu_type: str = ""
    """The GPU type (resource flavor) these GPUs are of; "" is the one implicit type of a
    policy that declares none."""


@dataclass(frozen=True, slots=True)
class CohortLimits:
    """A cohort's limits for one GPU type; None = no limit."""

    borrowing_limit_gpus: int | None = None
    """Most GPUs its members together may use above the cohort's guarantee (the sum of their
    lendable guarantees), borrowed from outside the cohort."""
    lending_limit_gpus: int | None = None
    """Most of the cohort's unused guarantee that work outside it may borrow."""


@dataclass(frozen=True, slots=True)
class Cohort:
    """A node of the quota tree (org -> group -> ...): teams and cohorts borrow from their
    siblings inside it first, and from outside it within its limits (Kueue's hierarchical
    cohorts). A cohort owns no GPUs: its guarantee is its members'."""

    name: str
    parent: str | None = None
    limits: tuple[tuple[str, CohortLimits], ...] = ()
    """Per GPU type ("" for the implicit one); a type not listed has no limits."""

    def limits_for(self, gpu_type: str) -> CohortLimits:
        for name, limits in self.limits:
            if name == gpu_type:
                return limits
        return _NO_LIMITS


_NO_LIMITS = CohortLimits()


@dataclass(frozen=True, slots=True)
class Team:
    name: str
    quotas: tuple[Quota, ...]
    weight: float = 1.0
    cohort: str | None = None
    """The cohort it belongs to; None: directly under the cluster."""

    @property
    def guaranteed_gpus(self) -> int:
        return sum(q.guaranteed_gpus for q in self.quotas)

    def quota_index(self, workload_class: WorkloadClass, gpu_type: str = "") -> int:
        for i, quota in enumerate(self.quotas):
            if workload_class in quota.classes and quota.gpu_type == gpu_type:
                return i
        of_type = f" of GPU type {gpu_type!r}" if gpu_type else ""
        raise KeyError(f"team {self.name!r} has no quota for workload class {workload_class!s}{of_type}")

    def has_quota(self, workload_class: WorkloadClass, gpu_type: str) -> bool:
        return any(workload_class in q.classes and q.gpu_type == gpu_type for q in self.quotas)


@dataclass(frozen=True, slots=True)
class PolicyKnobs:
    ordering: Ordering = Ordering.FAIR_SHARE
    preemption: PreemptionMode = PreemptionMode.CHECKPOINT_AWARE
    borrowing: bool = True
    """False caps every team at its guarantee (a static partition)."""
    enforce_quota: bool = True
    """False ignores quotas entirely (FIFO and strict-priority baselines)."""
    backfill: bool = True
    """False stops at the first request that does not fit (strict FIFO)."""
    max_reservations: int = 1
    """Blocked gangs that hold GPUs on chosen nodes so backfill cannot delay them."""
    reservation_move_gpus: int | None = 4
    """A blocked gang's reservation (blocked-head or starving) moves to the nodes closest to
    fitting it once they would hold at least this many more free GPUs than its own nodes do:
    the nodes chosen when it blocked may run jobs for days. None: it stays until nodes are
    added or removed. Tuned on September (docs/scheduler_results.md, sections 4.1-4.2)."""
    preemption_grace_s: float = 120.0
    usage_half_life_s: float = 6 * 3600.0
    max_preemption_attempts: int = 8
    """Blocked requests per schedule() that may look for victims (bounds decision latency)."""
    starvation_after_s: float | None = 24 * 3600.0
    """A request queued longer than this goes ahead of fair share within its priority (oldest
    first), so it reaches a reservation; None turns aging off."""
    starving_reservations_per_team: int = 0
    """Reservations of their own for a team's gangs queued past `starvation_after_s` (oldest
    first); neither blocked-head reservations nor preemptors' holds count against it. 0 (off)
    until tuned: on September one per team raised the worst-team p99 (docs/scheduler_results.md)."""
    starving_blocks_team: bool = False
    """A starving request that does not start holds back every later-submitted request of
    its own team at its priority or below for the rest of that decision, so the team's
    smaller jobs stop overtaking it (Kueue's StrictFIFO, applied once a request starves)."""
    starvation_preempt_after_s: float | None = None
    """A starving gang queued longer than this may preempt strictly lower-priority leases past
    their minimum runtime, of any team (escalation); None turns escalation off."""
    restart_cost_s: float = 600.0
    """Seconds of GPU time a victim also loses to restart (reload its checkpoint, rebuild its
    process group); makes big gangs costlier victims in checkpoint-aware ordering."""
    preemption_retry_s: float = 60.0
    """A request that found no victims looks again only after this long."""
    nominal_first: bool = False
    """Kueue's admission order: every request that fits its guarantee (all priorities) before
    any that would borrow, then priority, then queue time (kueue pkg/scheduler/scheduler.go,
    `entryOrdering.Less`: "1. request under nominal quota before borrowing, 2. higher
    priority first, 3. FIFO"). The `kueue` baseline sets it; switchyard orders by priority."""
    fair_share_reclaim: bool = False
    """A borrowing gang may take another team's borrowed, preemptible lease of no higher
    priority, past both its protections, if its own borrowed share after admission plus
    `fair_share_margin_gpus` stays at or below the victim's after the loss (Kueue's
    LessThanOrEqualToFinalShare; `core.fair_reclaim`)."""
    fair_share_margin_gpus: float = 8.0
    """Hysteresis of fair-share reclaim, in borrowed GPUs over the team weight."""
    fair_share_reclaim_multi_node_only: bool = False
    """Fair-share reclaim only for gangs of several bundles (nodes): a one-node job fits
    between others anyway, and letting it reclaim refilled the nodes that 32-GPU gangs waited
    for (September at 672 GPUs: worst-team p99 365k s with every gang, 305k with these only)."""
    when_can_borrow: WhenCanBorrow = WhenCanBorrow.BORROW
    """A request listing several GPU types takes the first that fits; whether borrowing in
    an earlier type beats fitting within the guarantee of a later one (Kueue's default: it does)."""


@dataclass(frozen=True, slots=True)
class SchedulerPolicy:
    priority_classes: tuple[PriorityClass, ...]
    teams: tuple[Team, ...]
    knobs: PolicyKnobs = field(default_factory=PolicyKnobs)
    gpu_types: tuple[str, ...] = ()
    """The GPU types (resource flavors), in the order a request that names none tries them;
    empty: one implicit type, every node and quota of it."""
    cohorts: tuple[Cohort, ...] = ()

    def __post_init__(self) -> None:
        names = [p.name for p in self.priority_classes]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate priority class names: {names}")
        teams = [t.name for t in self.teams]
        if len(set(teams)) != len(teams):
            raise ValueError(f"duplicate team names: {teams}")
        cohorts = {c.name for c in self.cohorts}
        if len(cohorts) != len(self.cohorts):
            raise ValueError(f"duplicate cohort names: {[c.name for c in self.cohorts]}")
        for owner, parent in [(t.name, t.cohort) for t in self.teams] + [(c.name, c.parent) for c in self.cohorts]:
            if parent is not None and parent not in cohorts:
                raise ValueError(f"{owner!r}: unknown cohort {parent!r}")
        declared = set(self.gpu_types) or {""}
        for team in self.teams:
            for quota in team.quotas:
                if quota.gpu_type not in declared:
                    raise ValueError(f"team {team.name!r}: unknown GPU type {quota.gpu_type!r}")

    @property
    def request_types(self) -> tuple[str, ...]:
        """The types a request that names none tries, in order."""
        return self.gpu_types or ("",)

    def priority(self, name: str) -> PriorityClass:
        for p in self.priority_classes:
            if p.name == name:
                return p
        raise KeyError(f"unknown priority class {name!r}")

    def team(self, name: str) -> Team:
        for t in self.teams:
            if t.name == name:
                return t
        raise KeyError(f"unknown team {name!r}")


DEFAULT_PRIORITY_CLASSES = (
    PriorityClass("production-inference", 1000, preemptible=False),
    PriorityClass("training", 100, preemptible=True, min_runtime_s=1800.0),
    PriorityClass("batch", 50, preemptible=True, min_runtime_s=600.0),
    PriorityClass("exploratory", 10, preemptible=True, min_runtime_s=0.0),
)
