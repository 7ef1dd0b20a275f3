"""The scheduler's service interface: what jobs, the gateway and the CLI may ask of it.

The live scheduler (a named Ray actor, `switchyard.cluster.scheduler_actor`) implements
`SchedulerService`; these pydantic models are what crosses the actor boundary, validated on
the way in so a malformed request fails at the caller with a message naming the field. A
preemption notice is `switchyard.scheduler.preemption_channel.PreemptionNotice`, the type a
job's preemption channel carries too.
"""

from __future__ import annotations

import json
import math
import re
import uuid
from enum import StrEnum
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from switchyard.scheduler.core.model import GangRequest, PlacementStrategy, WorkloadClass
from switchyard.scheduler.preemption_channel import PreemptionNotice

MAX_WORKLOAD_ID_CHARS = 256
MAX_DESCRIPTION_CHARS = 4096
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class WorkloadSubmission(BaseModel):
    """A request for a gang of GPUs: every bundle on one node, all bundles or none.

    What a new submission must also be is `check_new` (the live scheduler's submit): the model
    itself stays as permissive as the logs and snapshots written before those checks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workload_id: str = Field(default_factory=lambda: f"wl-{uuid.uuid4().hex[:10]}")
    team: str
    workload_class: WorkloadClass = WorkloadClass.TRAINING
    priority_class: str = "training"
    bundles: tuple[int, ...] = Field(min_length=1)  # GPUs per bundle
    strategy: PlacementStrategy = PlacementStrategy.PACK
    same_node_group: bool = False
    node_group: str | None = None
    checkpoint_interval_s: float | None = Field(default=None, gt=0)
    description: str = ""
    # When set, the scheduler launches the workload itself through the Ray Jobs API on admission;
    # otherwise the caller (a running job) polls `lease()` and starts when granted.
    entrypoint: str | None = None
    runtime_env: dict[str, Any] | None = None

    def check_new(self) -> None:
        """Raises ValueError naming the field a new submission cannot carry:
        - a `workload_id` empty, longer than 256 characters or with a control character: it names
          the workload in logs (a newline would forge a line), the journal, metrics and its Ray
          job;
        - a non-finite `checkpoint_interval_s`, or a `runtime_env` that is not plain JSON: the
          log is JSON, so the one would be refused by it and the other read back as another;
        - a description longer than 4,096 characters."""
        # Type-checked too: a model built with `model_construct` or `model_copy(update=...)`
        # holds whatever its caller put there.
        wid = self.workload_id
        if not isinstance(wid, str) or not wid or len(wid) > MAX_WORKLOAD_ID_CHARS or _CONTROL.search(wid):
            raise ValueError(
                f"workload_id {str(wid)[:60]!r}: expected 1 to {MAX_WORKLOAD_ID_CHARS} characters, "
                "none of them a control character"
            )
        interval = self.checkpoint_interval_s
        if interval is not None and not (isinstance(interval, int | float) and math.isfinite(interval)):
            raise ValueError(f"workload {wid!r}: checkpoint_interval_s must be a finite number of seconds")
        if not isinstance(self.description, str) or len(self.description) > MAX_DESCRIPTION_CHARS:
            raise ValueError(
                f"workload {wid!r}: description must be text of at most {MAX_DESCRIPTION_CHARS} characters"
            )
        try:
            json.dumps(self.runtime_env, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"workload {wid!r}: runtime_env must hold only JSON (strings, finite numbers, lists, objects): {exc}"
            ) from None

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
