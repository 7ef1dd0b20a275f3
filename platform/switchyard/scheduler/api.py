"""The scheduler's service interface: what jobs, the gateway and the CLI may ask of it.

The live scheduler (a named Ray actor, `switchyard.cluster.scheduler_actor`) implements
`SchedulerService`; these pydantic models are what crosses the actor boundary, validated on
the way in so a malformed request fails at the caller with a message naming the field. A
preemption notice is `switchyard.scheduler.preemption_channel.PreemptionNotice`, the type a
job's preemption channel carries too.
"""

from __future__ import annotations

import json
import uuid
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator

from switchyard.scheduler.core.model import GangRequest, PlacementStrategy, WorkloadClass
from switchyard.scheduler.preemption_channel import PreemptionNotice

NO_CONTROLS = r"^[^\x00-\x1f\x7f-\x9f]*$"
MAX_WORKLOAD_ID_CHARS = 256
MAX_DESCRIPTION_CHARS = 4096


class WorkloadSubmission(BaseModel):
    """A request for a gang of GPUs: every bundle on one node, all bundles or none."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    # An id names the workload in logs, the event journal, metrics and its Ray job's id: no
    # control character (a newline would forge a log line), and short.
    workload_id: str = Field(
        default_factory=lambda: f"wl-{uuid.uuid4().hex[:10]}",
        min_length=1,
        max_length=MAX_WORKLOAD_ID_CHARS,
        pattern=NO_CONTROLS,
    )
    team: str
    workload_class: WorkloadClass = WorkloadClass.TRAINING
    priority_class: str = "training"
    bundles: tuple[int, ...] = Field(min_length=1)  # GPUs per bundle
    strategy: PlacementStrategy = PlacementStrategy.PACK
    same_node_group: bool = False
    node_group: str | None = None
    checkpoint_interval_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    description: str = Field(default="", max_length=MAX_DESCRIPTION_CHARS)
    # When set, the scheduler launches the workload itself through the Ray Jobs API on admission;
    # otherwise the caller (a running job) polls `lease()` and starts when granted.
    entrypoint: str | None = None
    runtime_env: dict[str, Any] | None = None

    @field_validator("runtime_env")
    @classmethod
    def _json_only(cls, env: dict[str, Any] | None) -> dict[str, Any] | None:
        """The scheduler logs a submission as JSON and launches its job from the log after a
        restart: a value JSON cannot hold (bytes, NaN) would be refused by the log or read back
        as another."""
        try:
            json.dumps(env, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"must hold only JSON (strings, finite numbers, lists, objects): {exc}") from None
        return env

    def gang(self) -> GangRequest:
        return GangRequest(
            workload_id=self.workload_id,
            team=self.team,
            workload_class=self.workload_class,
            priority_class=self.priority_class,
            bundles=self.bundles,
            strategy=self.strategy,
            same_node_group=self.same_node_group,
            node_group=self.node_group,
            checkpoint_interval_s=self.checkpoint_interval_s,
        )


class Placement(BaseModel):
    node_id: str
    node_group: str
    gpus: int


class LeaseGrant(BaseModel):
    """GPUs granted to a workload: one placement per bundle, in bundle order."""

    lease_id: str
    workload_id: str
    team: str
    placements: tuple[Placement, ...]
    granted_at: float
    borrowing: bool


class StopReason(StrEnum):
    """Why the scheduler stops the job running on a lease. The first two are the core's
    `StopOrder.reason`s; the others are the live scheduler's own."""

    CANCELLED = "cancelled"
    GRACE_PERIOD_OVER = "grace period over"
    CLAIM_TIMEOUT = "claim_timeout"  # a launch that started after its grant was taken back
    NODE_LOST = "node_lost"  # its workers on other nodes would keep their GPUs
    DRAIN = "drain"  # its grace period ran out on a node an operator drains
    GRANT_DISPLACED = "grant_displaced"  # Ray gave the granted GPUs to a Serve replica first


class ReleaseOutcome(StrEnum):
    """What `release` tells the job: whether its workload waits in the queue again."""

    REQUEUED = "requeued"  # a later admission of the same workload follows (`release` -> True)
    RELEASED = "released"  # the workload is over (`release` -> False)

    @classmethod
    def of(cls, requeued: bool) -> ReleaseOutcome:
        return cls.REQUEUED if requeued else cls.RELEASED


class SchedulerService(Protocol):
    def submit(self, submission: WorkloadSubmission) -> str:
        """Queue a workload; returns its id. Admission happens on the scheduler's next tick."""
        ...

    def lease(self, workload_id: str) -> LeaseGrant | None:
        """The workload's lease once admitted; None while it waits."""
        ...

    def release(self, lease_id: str, finished: bool) -> bool:
        """Give the GPUs back: finished, or preempted-and-checkpointed (then it requeues)."""
        ...

    def preemption_notice(self, workload_id: str) -> PreemptionNotice | None:
        """The preemption notice the workload's lease is under, if any: checkpoint and release by
        its `deadline`, or be stopped then. Its `job_id` is the workload id."""
        ...

    def report_checkpoint(self, workload_id: str) -> None: ...

    def cancel(self, workload_id: str) -> None: ...

    def status(self) -> dict[str, Any]: ...
