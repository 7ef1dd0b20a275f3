"""What the live scheduler must get back after a restart: the core and the tables around it.

`LiveState` is snapshotted as a versioned JSON document (`driver.snapshot`); the events after a
snapshot are in the write-ahead log. Journals from before the log held a pickle of it, read
once to migrate: those name the class `switchyard.cluster.scheduler_actor.LiveState` and their
launched jobs `switchyard.cluster.job_launcher.LaunchedJob`; the actor module keeps the first
name as an alias and `__setstate__` turns the second into this module's record.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from switchyard.scheduler.api import LeaseGrant, Placement, WorkloadSubmission
from switchyard.scheduler.core import Node, Scheduler
from switchyard.scheduler.core.model import workload_of_lease
from switchyard.scheduler.preemption_channel import PreemptionNotice
from switchyard.scheduler.queue_view import WaitLog

RELEASES_KEPT = 10_000
ANSWERS_KEPT = 10_000


@dataclass(frozen=True)
class LaunchedJob:
    """A workload the scheduler launched through the Ray Jobs API, as the Ray job it became."""

    workload_id: str
    submission_id: str


@dataclass(frozen=True)
class NodeCordon:
    """An operator's cordon of a node (`switchyard nodes cordon | drain`): no new lease there.
    Kept while the node is away from the cluster, so a node that comes back is still cordoned."""

    node: str
    since: float
    drain_requested_at: float | None = None  # set by a drain: its leases were put under notice


@dataclass
class LiveState:
    """Everything the actor must get back after a restart (pickled by the journal)."""

    core: Scheduler
    nodes: dict[str, Node] = field(default_factory=dict)
    submissions: dict[str, WorkloadSubmission] = field(default_factory=dict)
    grants: dict[str, LeaseGrant] = field(default_factory=dict)  # workload id -> current lease
    notices: dict[str, PreemptionNotice] = field(default_factory=dict)  # workload id -> the notice its lease is under
    claims: dict[str, str] = field(default_factory=dict)  # workload id -> Ray job id using the lease
    launched: dict[str, LaunchedJob] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    queued_since: dict[str, float] = field(default_factory=dict)
    # Leases the scheduler ended itself (grace period over, node lost) whose workload stayed
    # queued and is not one it launches: lease id -> workload. The job still holding that
    # lease id says, when it releases it, whether it will come back for the workload.
    ended: dict[str, str] = field(default_factory=dict)
    waits: WaitLog = field(default_factory=WaitLog)  # admissions of the last day, for `status`
    # What each recent `release` answered (True: requeued), so a repeated call (a client retry,
    # or Ray replaying calls after an actor restart) gets the same answer. Lease ids are unique
    # per attempt. Booleans, not `ReleaseOutcome`s: journals already hold them so.
    released: dict[str, bool] = field(default_factory=dict)
    claim_timeouts: dict[str, int] = field(default_factory=dict)  # workload id -> grants it lost in a row
    # Request ids of the submits, cancels and node commands done, with the workload (or node)
    # each was for: a call retried after an actor restart (or by the client) is answered, not
    # done twice.
    answered: dict[str, str] = field(default_factory=dict)
    # Workloads that are over (released finished, cancelled, ended), oldest first: pruned from
    # `submissions` and the attempt counters after the retention period.
    finished_at: dict[str, float] = field(default_factory=dict)
    cordons: dict[str, NodeCordon] = field(default_factory=dict)  # node name -> its cordon

    def remember_release(self, lease_id: str, requeued: bool, keep: int = RELEASES_KEPT) -> bool:
        self.released[lease_id] = requeued
        _keep_newest(self.released, keep)
        return requeued

    def remember_request(self, request_id: str | None, workload_id: str, keep: int = ANSWERS_KEPT) -> None:
        if request_id is not None:
            self.answered[request_id] = workload_id
            _keep_newest(self.answered, keep)

    def finished(self, workload_id: str, now: float) -> None:
        self.finished_at.pop(workload_id, None)  # re-inserted: the dict stays in time order
        self.finished_at[workload_id] = now

    def prune_finished(self, before: float) -> list[str]:
        """Forget the workloads finished before `before`; returns their ids."""
        pruned = []
        for workload_id, at in self.finished_at.items():
            if at >= before:
                break
            pruned.append(workload_id)
        for workload_id in pruned:
            del self.finished_at[workload_id]
            for table in (self.submissions, self.attempts, self.claim_timeouts):
                table.pop(workload_id, None)
        return pruned

    def workload_of(self, lease_id: str) -> str | None:
        """The workload whose current grant is `lease_id` (by the id's form: no scan)."""
        workload = workload_of_lease(lease_id)
        grant = self.grants.get(workload)
        return workload if grant is not None and grant.lease_id == lease_id else None

    def team_of(self, workload_id: str) -> str:
        sub = self.submissions.get(workload_id)
        return sub.team if sub is not None else ""

    def grant(
        self, lease_id: str, sub: WorkloadSubmission, placement: tuple[str, ...], borrowing: bool, now: float
    ) -> LeaseGrant:
        """The grant a job sees for a lease the core started: one placement per bundle."""
        return LeaseGrant(
            lease_id=lease_id,
            workload_id=sub.workload_id,
            team=sub.team,
            granted_at=now,
            borrowing=borrowing,
            placements=tuple(
                Placement(node_id=node, node_group=self.nodes[node].node_group, gpus=gpus)
                for node, gpus in zip(placement, sub.bundles, strict=True)
            ),
        )

    def forget_lease(self, workload_id: str, requeued: bool, now: float) -> None:
        """The workload's lease is over: requeued (it waits again, and a job it was launched as
        is launched again on admission) or done."""
        self.grants.pop(workload_id, None)
        self.notices.pop(workload_id, None)
        self.claims.pop(workload_id, None)
        if requeued:
            self.queued_since[workload_id] = now
        else:
            self.launched.pop(workload_id, None)
            self.forget_ended(workload_id)
            self.finished(workload_id, now)

    def drop_workload(self, workload_id: str, now: float) -> None:
        """The workload is withdrawn (its submission stays, for `list_workloads`, until the
        retention period is over)."""
        for table in (self.grants, self.notices, self.claims, self.queued_since):
            table.pop(workload_id, None)
        self.forget_ended(workload_id)
        self.finished(workload_id, now)

    def forget_ended(self, workload_id: str) -> None:
        """The workload is done: no job will come back for it through an ended lease."""
        for lease_id in [lid for lid, w in self.ended.items() if w == workload_id]:
            del self.ended[lease_id]

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A journal written before a field existed restores with that field's default.
        defaults = {f.name: f.default_factory() for f in fields(self) if f.default_factory is not MISSING}
        self.__dict__.update({**defaults, **state})
        # Older journals hold the Ray adapter's launched-job record: the same two fields.
        self.launched = {w: LaunchedJob(j.workload_id, j.submission_id) for w, j in self.launched.items()}


def _keep_newest(table: dict[str, Any], keep: int) -> None:
    while len(table) > keep:
        del table[next(iter(table))]  # the oldest (dicts keep insertion order)
