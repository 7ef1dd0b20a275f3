"""The schema of `policies/scheduler.yaml` (pydantic) and its conversion to a SchedulerPolicy.

A bad file fails with the file, the line, the field path and pydantic's reason
(read through `switchyard.config_file`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic_core import InitErrorDetails, PydanticCustomError

from switchyard.config_file import ConfigFileError, read_yaml, validate
from switchyard.scheduler.core.model import WorkloadClass
from switchyard.scheduler.core.policy import (
    DEFAULT_PRIORITY_CLASSES,
    Cohort,
    CohortLimits,
    Ordering,
    PolicyKnobs,
    PreemptionMode,
    PriorityClass,
    Quota,
    SchedulerPolicy,
    Team,
    WhenCanBorrow,
)

Loc = tuple[str | int, ...]


class PolicyFileError(ConfigFileError):
    """scheduler.yaml is unreadable or invalid; the message names the file, line and field."""


class _Strict(BaseModel):
    # No inf or NaN: a knob that is off says `null`, not `.inf` (YAML reads `.inf` as a number).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class KnobsSpec(_Strict):
    ordering: Ordering = Ordering.FAIR_SHARE
    preemption: PreemptionMode = PreemptionMode.CHECKPOINT_AWARE
    borrowing: bool = True
    enforce_quota: bool = True
    backfill: bool = True
    max_reservations: int = Field(1, ge=0)
    reservation_move_gpus: int | None = Field(4, ge=1)  # a reservation moves to gather this many more
    preemption_grace_s: float = Field(120.0, ge=0)
    usage_half_life_s: float = Field(6 * 3600.0, gt=0)
    max_preemption_attempts: int = Field(8, ge=0)
    preemption_retry_s: float = Field(60.0, ge=0)
    restart_cost_s: float = Field(600.0, ge=0)
    starvation_after_s: float | None = Field(24 * 3600.0, gt=0)
    starving_reservations_per_team: int = Field(0, ge=0)
    starvation_preempt_after_s: float | None = Field(None, gt=0)
    starving_blocks_team: bool = False  # a starving request holds back its team's later ones
    nominal_first: bool = False  # Kueue's order: requests inside their guarantee before borrowing ones
    when_can_borrow: WhenCanBorrow = WhenCanBorrow.BORROW  # Kueue's flavorFungibility.whenCanBorrow
    fair_share_reclaim: bool = False  # borrowers below their share take from those above it
    fair_share_margin_gpus: float = Field(8.0, ge=0)  # its hysteresis, borrowed GPUs / weight
    fair_share_reclaim_multi_node_only: bool = False  # only gangs of several bundles reclaim fairly

    @model_validator(mode="after")
    def _escalation_after_aging(self) -> KnobsSpec:
        if self.starvation_preempt_after_s is None:
            return self
        if self.starvation_after_s is None or self.starvation_preempt_after_s < self.starvation_after_s:
            raise ValueError(
                f"starvation_preempt_after_s ({self.starvation_preempt_after_s}) must be at least "
                f"starvation_after_s ({self.starvation_after_s}), which must be set"
            )
        return self


class PriorityClassSpec(_Strict):
    name: str = Field(min_length=1)
    value: int
    preemptible: bool
    min_runtime_s: float = Field(0.0, ge=0)
    """Protection from priority preemption after each start."""
    reclaim_min_runtime_s: float = Field(0.0, ge=0)
    """Protection of borrowed GPUs from reclaim after each start (inference reclaim excepted)."""
    preemption_backoff_s: float = Field(0.0, ge=0)
    """Protection after the n-th preemption: this x 2^(n-1), at most max_preemption_backoff_s."""
    max_preemption_backoff_s: float = Field(0.0, ge=0)
    max_preemptions: int | None = Field(None, ge=1)
    """Settled after this many preemptions: no one's victim any more (docs/scheduler.md)."""

    @model_validator(mode="after")
    def _protection_is_coherent(self) -> PriorityClassSpec:
        protects = self.min_runtime_s or self.reclaim_min_runtime_s or self.preemption_backoff_s or self.max_preemptions
        if not self.preemptible and protects:
            raise ValueError(
                f"priority class {self.name!r} is not preemptible: "
                "a minimum runtime, backoff or preemption cap means nothing for it"
            )
        if self.max_preemption_backoff_s and self.max_preemption_backoff_s < self.preemption_backoff_s:
            raise ValueError(
                f"priority class {self.name!r}: max_preemption_backoff_s "
                f"({self.max_preemption_backoff_s}) is below preemption_backoff_s "
                f"({self.preemption_backoff_s})"
            )
        return self


class QuotaSpec(_Strict):
    classes: list[WorkloadClass] = Field(min_length=1)
    guaranteed_gpus: int = Field(ge=0)
    borrowing_limit_gpus: int | None = Field(None, ge=0)
    lending_limit_gpus: int | None = Field(None, ge=0)
    gpu_type: str | None = Field(None, min_length=1)
    """One of `gpu_types`; required when the file declares types, absent when it does not."""


class TeamSpec(_Strict):
    name: str = Field(min_length=1)
    weight: float | None = Field(None, gt=0)
    """Fair-share weight; defaults to the team's total guarantee (at least 1)."""
    cohort: str | None = Field(None, min_length=1)
    """The cohort it borrows inside first; none: directly under the cluster."""
    quotas: list[QuotaSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_quota_per_class(self) -> TeamSpec:
        seen: dict[str | None, set[WorkloadClass]] = {}
        for quota in self.quotas:
            mine = seen.setdefault(quota.gpu_type, set())
            overlap = mine & set(quota.classes)
            if overlap:
                of_type = f" of GPU type {quota.gpu_type!r}" if quota.gpu_type else ""
                raise ValueError(f"workload class {sorted(overlap)} appears in two quotas{of_type}")
            mine |= set(quota.classes)
        return self


GpuLimit = int | dict[str, int] | None
"""A cohort's limit: one number for every GPU type, or one per type; none: no limit."""


class CohortSpec(_Strict):
    name: str = Field(min_length=1)
    parent: str | None = Field(None, min_length=1)
    """The cohort above it; none: directly under the cluster."""
    borrowing_limit_gpus: int | dict[str, int] | None = None
    """Most GPUs its members together may borrow from outside it (per GPU type)."""
    lending_limit_gpus: int | dict[str, int] | None = None
    """Most of its members' unused guarantee that work outside it may borrow (per GPU type)."""

    @model_validator(mode="after")
    def _limits_not_negative(self) -> CohortSpec:
        for field, limit in (
            ("borrowing_limit_gpus", self.borrowing_limit_gpus),
            ("lending_limit_gpus", self.lending_limit_gpus),
        ):
            values = limit.values() if isinstance(limit, dict) else [] if limit is None else [limit]
            if any(v < 0 for v in values):
                raise ValueError(f"cohort {self.name!r}: {field} must be at least 0")
        return self

    def limits(self, gpu_types: tuple[str, ...]) -> tuple[tuple[str, CohortLimits], ...]:
        def of(limit: GpuLimit, gpu_type: str) -> int | None:
            return limit.get(gpu_type) if isinstance(limit, dict) else limit

        return tuple(
            (t, CohortLimits(of(self.borrowing_limit_gpus, t), of(self.lending_limit_gpus, t))) for t in gpu_types
        )


class SchedulerFile(_Strict):
    version: int = Field(1, ge=1, le=1)
    policy: KnobsSpec = KnobsSpec()
    priority_classes: list[PriorityClassSpec] | None = None
    gpu_types: list[str] = Field(default_factory=list)
    """GPU types (resource flavors), in the order a request that names none tries them; none:
    one implicit type (no quota or request names a type)."""
    cohorts: list[CohortSpec] = Field(default_factory=list)
    teams: list[TeamSpec] = Field(default_factory=list)

    @model_validator(mode="wrap")
    @classmethod
    def _references_resolve(cls, data: object, handler: Callable[[object], SchedulerFile]) -> SchedulerFile:
        """Names that point elsewhere in the file (GPU types, cohorts) must exist; each error is
        reported at the field that names it, so the message carries its line."""
        spec = handler(data)
        problems = spec._reference_problems()
        if problems:
            raise ValidationError.from_exception_data(
                cls.__name__,
                [
                    InitErrorDetails(
                        type=PydanticCustomError("reference", "{message}", {"message": message}), loc=loc, input=None
                    )
                    for loc, message in problems
                ],
            )
        return spec

    def _reference_problems(self) -> list[tuple[Loc, str]]:
        out: list[tuple[Loc, str]] = []
        for field, kind, names_of in (
            ("teams", "team", [t.name for t in self.teams]),
            ("priority_classes", "priority class", [p.name for p in self.priority_classes or ()]),
        ):
            for i, name in enumerate(names_of):
                if names_of.index(name) != i:  # the core refuses it too, but with no line to point at
                    out.append(((field, i, "name"), f"{kind} {name!r} is declared twice"))
        types = set(self.gpu_types)
        if len(types) != len(self.gpu_types):
            out.append((("gpu_types",), f"GPU types must be unique, got {self.gpu_types}"))
        declared = ", ".join(self.gpu_types) or "none"
        for i, team in enumerate(self.teams):
            for j, quota in enumerate(team.quotas):
                loc: Loc = ("teams", i, "quotas", j, "gpu_type")
                if quota.gpu_type is None and types:
                    out.append((loc, f"team {team.name!r}: a quota must name its GPU type (declared: {declared})"))
                elif quota.gpu_type is not None and quota.gpu_type not in types:
                    out.append((loc, f"team {team.name!r}: unknown GPU type {quota.gpu_type!r} (declared: {declared})"))
        names = [c.name for c in self.cohorts]
        for i, cohort in enumerate(self.cohorts):
            if names.index(cohort.name) != i:
                out.append((("cohorts", i, "name"), f"cohort {cohort.name!r} is declared twice"))
            if cohort.parent is not None and cohort.parent not in names:
                out.append(
                    (("cohorts", i, "parent"), f"cohort {cohort.name!r}: unknown parent cohort {cohort.parent!r}")
                )
            for field in ("borrowing_limit_gpus", "lending_limit_gpus"):
                limit = getattr(cohort, field)
                for gpu_type in limit if isinstance(limit, dict) else ():
                    if gpu_type not in types:
                        out.append(
                            (
                                ("cohorts", i, field, gpu_type),
                                f"cohort {cohort.name!r}: unknown GPU type {gpu_type!r} (declared: {declared})",
                            )
                        )
        out.extend(self._cycles(names))
        for i, team in enumerate(self.teams):
            if team.cohort is not None and team.cohort not in names:
                out.append((("teams", i, "cohort"), f"team {team.name!r}: unknown cohort {team.cohort!r}"))
        return out

    def _cycles(self, names: list[str]) -> list[tuple[Loc, str]]:
        parent = {c.name: c.parent for c in self.cohorts}
        out: list[tuple[Loc, str]] = []
        for i, cohort in enumerate(self.cohorts):
            seen, above = {cohort.name}, cohort.parent
            while above is not None and above in parent:
                if above in seen:
                    out.append((("cohorts", i, "parent"), f"cohort {cohort.name!r}: its parents form a cycle"))
                    break
                seen.add(above)
                above = parent[above]
        return out

    def to_policy(self) -> SchedulerPolicy:
        classes = (
            DEFAULT_PRIORITY_CLASSES
            if self.priority_classes is None
            else tuple(PriorityClass(**p.model_dump()) for p in self.priority_classes)
        )
        teams = tuple(_team(t) for t in self.teams)
        gpu_types = tuple(self.gpu_types)
        cohorts = tuple(Cohort(c.name, c.parent, c.limits(gpu_types or ("",))) for c in self.cohorts)
        return SchedulerPolicy(classes, teams, PolicyKnobs(**self.policy.model_dump()), gpu_types, cohorts)


def _team(spec: TeamSpec) -> Team:
    quotas = tuple(
        Quota(
            frozenset(q.classes),
            q.guaranteed_gpus,
            q.borrowing_limit_gpus,
            q.lending_limit_gpus,
            q.gpu_type or "",
        )
        for q in spec.quotas
    )
    guaranteed = sum(q.guaranteed_gpus for q in quotas)
    weight = spec.weight if spec.weight is not None else float(max(1, guaranteed))
    return Team(spec.name, quotas, weight, spec.cohort)


def load_policy_file(path: str | Path) -> SchedulerFile:
    return validate(read_yaml(path, error=PolicyFileError), SchedulerFile, error=PolicyFileError)
