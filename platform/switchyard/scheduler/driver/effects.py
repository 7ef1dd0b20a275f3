"""What the live scheduler's driver asks its Ray adapter to do, as values.

Two kinds. *Bookkeeping* (`SaveState`, `JournalEvent`, the metric records, `Diagnostic`) is
done by the adapter inside its lock, before any caller can observe the change, in the order
given (journal order is what operators and the cause chains read). *Cluster actions* (notices,
stops, launches) do I/O against Ray and are carried out after the lock is released, in
`CLUSTER_ORDER`; each may fail on its own without the others being lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from switchyard.scheduler.api import StopReason
from switchyard.scheduler.driver.state import LaunchedJob
from switchyard.scheduler.preemption_channel import PreemptionNotice


class EventKind(StrEnum):
    """The kinds of event the driver journals (the event log's `kind` column)."""

    SUBMITTED = "submitted"
    ADMITTED = "admitted"
    PREEMPTION_NOTICE = "preemption_notice"
    STOP_ORDER = "stop_order"
    REQUEUED = "requeued"
    RELEASED = "released"
    CANCELLED = "cancelled"
    RESUMED = "resumed"
    NODE_LOST = "node_lost"
    CLAIM_TIMEOUT = "claim_timeout"
    LAUNCH_FAILED = "launch_failed"
    GRANT_DISPLACED = "grant_displaced"
    JOB_EXITED = "job_exited"
    ENDED = "ended"
    # Serve's GPU replicas (`serve_replicas`): one queued, or adopted where Ray placed it.
    REPLICA_PENDING = "replica_pending"
    ADOPTED = "adopted"
    # An operator's node commands (`switchyard nodes ...`): journaled with no workload.
    NODE_CORDONED = "node_cordoned"
    NODE_UNCORDONED = "node_uncordoned"
    NODE_DRAINED = "node_drained"


# -- bookkeeping: inside the lock ------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class SaveState:
    """The state changed. (The actor logs every event it applies regardless: a tick can move
    the core's internal clocks without a decision, and replay must see it.)"""


@dataclass(frozen=True, slots=True)
class JournalEvent:
    kind: EventKind
    workload_id: str
    team: str
    at: float
    details: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RecordAdmission:
    """For the queue-wait histogram."""

    team: str
    priority_class: str
    gpus: int
    waited_s: float


@dataclass(frozen=True, slots=True)
class RecordPreemption:
    team: str
    reason: str
    lost_gpu_s: float


@dataclass(frozen=True, slots=True)
class Diagnostic:
    """A line for the operator's log (the driver itself writes nothing)."""

    message: str
    warning: bool = True


# -- cluster actions: after the lock ---------------------------------------------------------
@dataclass(frozen=True, slots=True)
class ClearNotice:
    """A workload was admitted: its last notice must not stop its next run at the first step."""

    workload_id: str


@dataclass(frozen=True, slots=True)
class SendNotice:
    """Post the notice to the job's preemption channel (its key: `notice.job_id`)."""

    notice: PreemptionNotice


@dataclass(frozen=True, slots=True)
class StopLaunchedJob:
    """Stop the Ray job the scheduler launched for the workload (Jobs API)."""

    job: LaunchedJob
    team: str
    reason: StopReason


@dataclass(frozen=True, slots=True)
class StopClaimedJob:
    """Stop the Ray job that claimed the workload's lease itself (it may not be stoppable: a
    driver started by hand is not a submitted job)."""

    workload_id: str
    ray_job_id: str
    team: str
    reason: StopReason


@dataclass(frozen=True, slots=True)
class LaunchJob:
    """Submit the workload's entrypoint as Ray job `<workload>-<attempt>` on its new lease.
    The adapter answers with `Driver.job_launched` or `Driver.launch_failed`."""

    workload_id: str
    lease_id: str
    attempt: int
    entrypoint: str
    runtime_env: dict[str, Any] | None


Bookkeeping = SaveState | JournalEvent | RecordAdmission | RecordPreemption | Diagnostic
ClusterAction = ClearNotice | SendNotice | StopLaunchedJob | StopClaimedJob | LaunchJob
Effect = Bookkeeping | ClusterAction

# Old notices are cleared before new ones go out (a workload admitted and noticed in one tick
# keeps its notice); stops come before launches, so GPUs are free in Ray before a job asks.
CLUSTER_ORDER: tuple[type[ClusterAction], ...] = (ClearNotice, SendNotice, StopLaunchedJob, StopClaimedJob, LaunchJob)


def split(effects: Iterable[Effect]) -> tuple[list[Bookkeeping], list[ClusterAction]]:
    """Bookkeeping in the order given; cluster actions in `CLUSTER_ORDER` (stable within a kind)."""
    books: list[Bookkeeping] = []
    actions: list[ClusterAction] = []
    for effect in effects:
        if isinstance(effect, ClearNotice | SendNotice | StopLaunchedJob | StopClaimedJob | LaunchJob):
            actions.append(effect)
        else:
            books.append(effect)
    actions.sort(key=lambda a: CLUSTER_ORDER.index(type(a)))
    return books, actions
