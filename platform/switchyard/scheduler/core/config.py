"""The schema of `policies/scheduler.yaml` (pydantic) and its conversion to a SchedulerPolicy.

A bad file fails with the file, the line, the field path and pydantic's reason
(read through `switchyard.config_file`).
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

from switchyard.config_file import ConfigFileError, read_yaml, validate
from switchyard.scheduler.core.model import WorkloadClass
from switchyard.scheduler.core.policy import (
    DEFAULT_PRIORITY_CLASSES,
    Ordering,
    PolicyKnobs,
    PreemptionMode,
    PriorityClass,
    Quota,
    SchedulerPolicy,
    Team,
)


class PolicyFileError(ConfigFileError):
    """scheduler.yaml is unreadable or invalid; the message names the file, line and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KnobsSpec(_Strict):
    ordering: Ordering = Ordering.FAIR_SHARE
    preemption: PreemptionMode = PreemptionMode.CHECKPOINT_AWARE
    borrowing: bool = True
    enforce_quota: bool = True
    backfill: bool = True
    max_reservations: int = Field(1, ge=0)
    preemption_grace_s: float = Field(120.0, ge=0)
    usage_half_life_s: float = Field(6 * 3600.0, gt=0)
    max_preemption_attempts: int = Field(8, ge=0)
    preemption_retry_s: float = Field(60.0, ge=0)
    restart_cost_s: float = Field(600.0, ge=0)
    starvation_after_s: float | None = Field(24 * 3600.0, gt=0)
    starving_reservations_per_team: int = Field(0, ge=0)
    starvation_preempt_after_s: float | None = Field(None, gt=0)
    nominal_first: bool = False  # Kueue's order: requests inside their guarantee before borrowing ones

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

    @model_validator(mode="after")
    def _protection_is_coherent(self) -> PriorityClassSpec:
        protects = self.min_runtime_s or self.reclaim_min_runtime_s or self.preemption_backoff_s
        if not self.preemptible and protects:
            raise ValueError(
                f"priority class {self.name!r} is not preemptible: a minimum runtime or backoff means nothing for it"
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


class TeamSpec(_Strict):
    name: str = Field(min_length=1)
    weight: float | None = Field(None, gt=0)
    """Fair-share weight; defaults to the team's total guarantee (at least 1)."""
    quotas: list[QuotaSpec] = Field(min_length=1)

    @model_validator(mode="after")
    def _one_quota_per_class(self) -> TeamSpec:
        seen: set[WorkloadClass] = set()
        for quota in self.quotas:
            overlap = seen & set(quota.classes)
            if overlap:
                raise ValueError(f"workload class {sorted(overlap)} appears in two quotas")
            seen |= set(quota.classes)
        return self


class SchedulerFile(_Strict):
    version: int = Field(1, ge=1, le=1)
    policy: KnobsSpec = KnobsSpec()
    priority_classes: list[PriorityClassSpec] | None = None
    teams: list[TeamSpec] = Field(default_factory=list)

    def to_policy(self) -> SchedulerPolicy:
        classes = (
            DEFAULT_PRIORITY_CLASSES
            if self.priority_classes is None
            else tuple(PriorityClass(**p.model_dump()) for p in self.priority_classes)
        )
        teams = tuple(_team(t) for t in self.teams)
        return SchedulerPolicy(classes, teams, PolicyKnobs(**self.policy.model_dump()))


def _team(spec: TeamSpec) -> Team:
    quotas = tuple(
        Quota(frozenset(q.classes), q.guaranteed_gpus, q.borrowing_limit_gpus, q.lending_limit_gpus)
        for q in spec.quotas
    )
    guaranteed = sum(q.guaranteed_gpus for q in quotas)
    weight = spec.weight if spec.weight is not None else float(max(1, guaranteed))
    return Team(spec.name, quotas, weight)


def load_policy_file(path: str | Path) -> SchedulerFile:
    return validate(read_yaml(path, error=PolicyFileError), SchedulerFile, error=PolicyFileError)
