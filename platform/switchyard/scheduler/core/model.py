"""The scheduler's vocabulary: workloads, gangs, nodes, leases and the decisions it emits.

Plain frozen dataclasses (not pydantic): the core builds and compares thousands of them per
decision, and only `scheduler.yaml` needs validation with file/field messages (see config.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum


class WorkloadClass(StrEnum):
    """What kind of work a request is; a team's quota is split by class."""

    INFERENCE = "inference"
    TRAINING = "training"
    BATCH_FINE_TUNE = "batch-fine-tune"
    EXPLORATORY = "exploratory"


class PlacementStrategy(StrEnum):
    """How a gang's bundles are laid out over nodes (Ray placement-group semantics)."""

    PACK = "PACK"  # as few nodes as possible, best effort
    STRICT_PACK = "STRICT_PACK"  # every bundle on one node, or not at all
    SPREAD = "SPREAD"  # distinct nodes where possible, best effort


class LeaseState(StrEnum):
    RUNNING = "running"
    PREEMPTING = "preempting"  # notice sent; still holds its GPUs until release or grace end


class HoldKind(StrEnum):
    """Why a reservation holds GPUs (docs/scheduler.md: reservations and bounded waits)."""

    BLOCKED_HEAD = "blocked-head"  # the first blocked gang in admission order (`max_reservations`)
    STARVING = "starving"  # a gang past `starvation_after_s`: its own, capped per team
    PREEMPTOR = "preemptor"  # the GPUs its victims are freeing


class PreemptionReason(StrEnum):
    RECLAIM = "reclaim"  # the victim borrowed quota its owner now needs back
    PRIORITY = "priority"  # a higher-priority workload needs the GPUs
    DRAIN = "drain"  # an operator drains the node it runs on (`core.cordon`)


@dataclass(frozen=True, slots=True)
class Node:
    """A machine: its GPUs and the topology labels placement uses."""

    name: str
    gpus: int
    node_group: str
    rack: str
    gpu_type: str = ""
    """Its GPUs' type (resource flavor), the same on every node of its group; "" where the
    policy declares no types."""


@dataclass(frozen=True, slots=True)
class GangRequest:
    """A workload asking for all of its bundles at once (all-or-nothing).

    Each bundle must fit on one node. `same_node_group` keeps every bundle inside one node
    group ("eight GPUs on the same node group"); `node_group` pins a specific one.
    """

    workload_id: str
    team: str
    workload_class: WorkloadClass
    priority_class: str
    bundles: tuple[int, ...]
    strategy: PlacementStrategy = PlacementStrategy.PACK
    same_node_group: bool = False
    node_group: str | None = None
    checkpoint_interval_s: float | None = None
    """Declared periodic checkpoint interval; None when the workload never checkpoints."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types it may run on, first choice first (the policy's order when empty); the
    whole gang runs on one type."""

    @property
    def gpus(self) -> int:
        return sum(self.bundles)


@dataclass(slots=True)
class PendingWorkload:
    """A request waiting for admission; `queued_at` orders it within its team and priority."""

    request: GangRequest
    submitted_at: float
    queued_at: float
    attempts: int = 0


@dataclass(slots=True)
class Lease:
    """A granted gang: which node holds each bundle, and its lifecycle for preemption."""

    lease_id: str
    request: GangRequest
    placement: tuple[str, ...]
    started_at: float
    submitted_at: float
    borrowing: bool
    state: LeaseState = LeaseState.RUNNING
    last_checkpoint_at: float | None = None
    notice_at: float | None = None
    stop_deadline: float | None = None
    stop_sent: bool = False
    prior_preemptions: int = 0
    """How often its workload was preempted before this lease started (for backoff)."""
    gpu_type: str = ""
    """The GPU type it runs on; its GPUs count against its team's quota of that type."""
    _by_node: dict[str, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        by_node: dict[str, int] = {}
        for node, size in zip(self.placement, self.request.bundles, strict=True):
            by_node[node] = by_node.get(node, 0) + size
        self._by_node = by_node

    @property
    def gpus(self) -> int:
        return self.request.gpus

    def gpus_by_node(self) -> dict[str, int]:
        """GPUs this lease holds on each node (shared; do not mutate)."""
        return self._by_node

    def checkpointed_at(self, now: float) -> float:
        """The latest time its progress is known to be saved (reported or by declared interval)."""
        latest = self.started_at
        interval = self.request.checkpoint_interval_s
        if interval is not None and interval > 0:
            latest = self.started_at + ((now - self.started_at) // interval) * interval
        if self.last_checkpoint_at is not None:
            latest = max(latest, self.last_checkpoint_at)
        return latest

    def lost_gpu_seconds(self, now: float) -> float:
        """GPU-seconds of work this lease would lose if stopped now."""
        return self.gpus * max(0.0, now - self.checkpointed_at(now))


@dataclass(frozen=True, slots=True)
class LeaseStart:
    """Start `workload_id` now, bundle i on node `placement[i]`."""

    lease_id: str
    workload_id: str
    team: str
    placement: tuple[str, ...]
    borrowing: bool
    gpu_type: str = ""


@dataclass(frozen=True, slots=True)
class PreemptionDecision:
    """The core's decision to put a lease under notice: its job is asked to checkpoint and
    release, and it is stopped at `stop_deadline` regardless. A decision, not the notice: the
    driver sends the job a `switchyard.scheduler.preemption_channel.PreemptionNotice` for it."""

    lease_id: str
    workload_id: str
    reason: PreemptionReason
    preemptor: str
    victim_rank: int
    """Position in the victim order for this preemptor (0 = chosen first)."""
    stop_deadline: float
    lost_gpu_seconds: float


@dataclass(frozen=True, slots=True)
class StopOrder:
    """Stop a lease now: its grace period passed, it checkpointed after a notice, or it was cancelled."""

    lease_id: str
    workload_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Reservation:
    """GPUs held on specific nodes for a blocked gang; nothing else may start on them."""

    workload_id: str
    gpus_by_node: tuple[tuple[str, int], ...]
    kind: HoldKind = HoldKind.BLOCKED_HEAD


@dataclass(slots=True)
class Decisions:
    """What the driver must carry out after one `schedule(now)` call."""

    starts: list[LeaseStart] = field(default_factory=list)
    notices: list[PreemptionDecision] = field(default_factory=list)
    stops: list[StopOrder] = field(default_factory=list)
    reservations: list[Reservation] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.starts or self.notices or self.stops)


def lease_name(workload_id: str, attempt: int) -> str:
    """A lease's id: `<workload>#<attempt>`, unique per attempt (ids are never reused)."""
    return f"{workload_id}#{attempt}"


def workload_of_lease(lease_id: str) -> str:
    """The workload a lease id (`lease_name`) belongs to."""
    return lease_id.rpartition("#")[0]
