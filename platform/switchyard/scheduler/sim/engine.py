"""The discrete-event simulator: replays jobs and inference demand through the policy core.

The simulator plays the live driver's part: it submits, releases, reports checkpoints and
carries out the core's decisions. A victim keeps running after its notice (a periodic
checkpoint that falls inside the grace period is reported, which the core only records) and
is stopped at the core's stop order when the grace period ends; it keeps the progress of its
last periodic checkpoint and loses the rest.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from enum import IntEnum

from switchyard.scheduler.core.model import (
    Decisions,
    GangRequest,
    Node,
    PlacementStrategy,
    WorkloadClass,
)
from switchyard.scheduler.core.policy import SchedulerPolicy
from switchyard.scheduler.core.scheduler import Scheduler
from switchyard.scheduler.core.snapshot import PendingStatus
from switchyard.scheduler.fairness import InversionLedger, ShareLedger
from switchyard.scheduler.fairness_timeline import FairnessTimeline
from switchyard.scheduler.sim.inference import InferenceDemand
from switchyard.scheduler.sim.teams import INFERENCE_TEAM
from switchyard.scheduler.sim.trace import TraceJob

INFERENCE_PRIORITY = "production-inference"


class EventKind(IntEnum):
    # Order within one instant: ends before starts, so freed GPUs are seen by new work.
    FINISH = 0
    CHECKPOINT = 1
    WAKE = 2
    TICK = 3
    SUBMIT = 4


@dataclass(frozen=True, slots=True)
class Cluster:
    gpus: int
    gpus_per_node: int = 8
    nodes_per_group: int = 16
    nodes_per_rack: int = 4
    gpu_types: tuple[str, ...] = ()
    """The policy's GPU types: node group g is of type `gpu_types[g % len(gpu_types)]`
    (round robin, so each type gets about as many groups); none: untyped nodes."""

    def nodes(self) -> list[Node]:
        count = math.ceil(self.gpus / self.gpus_per_node)
        return [self._node(i) for i in range(count)]

    def _node(self, i: int) -> Node:
        group = i // self.nodes_per_group
        gpu_type = self.gpu_types[group % len(self.gpu_types)] if self.gpu_types else ""
        return Node(
            f"node-{i:05d}",
            self.gpus_per_node,
            f"group-{group:04d}",
            f"rack-{i // self.nodes_per_rack:05d}",
            gpu_type,
        )


@dataclass(frozen=True, slots=True)
class SimWindow:
    start_s: float
    end_s: float
    tail_s: float = 30 * 86400.0
    """How long after the window the simulation may run so that window jobs can finish."""


@dataclass(slots=True)
class JobRecord:
    workload_id: str
    team: str
    gpus: int
    priority_class: str
    submit_s: float
    duration_s: float
    remaining_s: float
    checkpoint_interval_s: float | None
    queued_since: float
    wait_s: float = 0.0
    first_start_s: float | None = None
    finish_s: float | None = None
    lease_id: str | None = None
    attempt_start_s: float = 0.0
    preemptions: int = 0
    lost_gpu_s: float = 0.0
    inference: bool = False


@dataclass(slots=True)
class SimTrace:
    """Everything metrics need, collected while the simulation runs."""

    window: SimWindow
    capacity: int
    jobs: list[JobRecord] = field(default_factory=list)
    inference: list[JobRecord] = field(default_factory=list)
    allocated_gpu_s: float = 0.0
    served_gpu_s: dict[str, float] = field(default_factory=dict)
    shares: ShareLedger | None = None
    """Received vs max-min fair GPU-seconds per team and hour (switchyard.scheduler.fairness)."""
    inversions: InversionLedger | None = None
    """GPU-weighted priority-inversion and quota-wait seconds per team."""
    hourly_allocated: list[float] = field(default_factory=list)
    end_s: float = 0.0
    events: int = 0
    preemption_notices: int = 0
    pending: list[PendingStatus] = field(default_factory=list)
    """Workloads still queued when the run ended, each with the core's reason."""


class Simulation:
    def __init__(
        self,
        policy: SchedulerPolicy,
        cluster: Cluster,
        jobs: list[TraceJob],
        window: SimWindow,
        inference: InferenceDemand | None = None,
        inversion_bound_s: float = 300.0,
    ) -> None:
        start = min([j.submit_s for j in jobs] + [window.start_s])
        self._core = Scheduler(policy, cluster.nodes(), now=start)
        self._policy = policy
        self._window = window
        self._inference = inference
        self._heap: list[tuple[float, int, int, str]] = []
        self._seq = 0
        self._records: dict[str, JobRecord] = {}
        self._jobs = {j.workload_id: j for j in jobs}
        self.trace = SimTrace(window, self._core.pool.total_gpus)
        guarantees = {team.name: sum(q.guaranteed_gpus for q in team.quotas) for team in policy.teams}
        # The same bookkeeping as the live driver's (switchyard.scheduler.fairness_timeline).
        self._fairness = FairnessTimeline(guarantees, self.trace.capacity, inversion_bound_s, window.start_s)
        self.trace.shares = self._fairness.shares
        self.trace.inversions = self._fairness.inversions
        self._now = start
        self._replicas_running: list[str] = []
        self._replicas_pending: list[str] = []
        self._replica_seq = 0
        self._unfinished_window_jobs = 0
        for job in jobs:
            if job.submit_s < window.end_s:
                self._push(job.submit_s, EventKind.SUBMIT, job.workload_id)
        if inference is not None:
            self._push(math.floor(start / 60) * 60.0, EventKind.TICK, "")

    # -- loop ---------------------------------------------------------------------------------
    def run(self) -> SimTrace:
        hard_end = self._window.end_s + self._window.tail_s
        while self._heap:
            t = self._heap[0][0]
            if t > hard_end or (t >= self._window.end_s and self._unfinished_window_jobs == 0):
                break
            self._advance(t)
            changed = False
            while self._heap and self._heap[0][0] == t:
                _, _, kind, key = heapq.heappop(self._heap)
                self.trace.events += 1
                changed |= self._handle(EventKind(kind), key, t)
            if changed:
                self._schedule(t)
        self._advance(max(self._now, min(hard_end, self._window.end_s)))
        self.trace.end_s = self._now
        for record in self._records.values():
            if record.lease_id is None and record.finish_s is None:
                record.wait_s += self._now - record.queued_since  # censored: never started
                record.queued_since = self._now
        self.trace.pending = list(self._core.snapshot(self._now).pending)
        return self.trace

    def _push(self, t: float, kind: EventKind, key: str) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, int(kind), key))

    def _handle(self, kind: EventKind, key: str, t: float) -> bool:
        if kind is EventKind.SUBMIT:
            self._submit(self._jobs[key], t)
            return True
        if kind is EventKind.FINISH:
            return self._finish(key, t)
        if kind is EventKind.CHECKPOINT:
            workload = key.rsplit("#", 1)[0]
            record = self._records[workload]
            if record.lease_id == key:
                self._core.report_checkpoint(workload, t)
                return True
            return False
        if kind is EventKind.TICK:
            return self._tick(t)
        return True  # WAKE: a grace period ends

    # -- driver actions -----------------------------------------------------------------------
    def _submit(self, job: TraceJob, t: float) -> None:
        record = JobRecord(
            job.workload_id,
            job.team,
            job.gpus,
            job.priority_class,
            job.submit_s,
            job.duration_s,
            job.duration_s,
            job.checkpoint_interval_s,
            t,
        )
        self._records[job.workload_id] = record
        if self._in_window(job.submit_s):
            self.trace.jobs.append(record)
            self._unfinished_window_jobs += 1
        self._core.submit(
            GangRequest(
                job.workload_id,
                job.team,
                job.workload_class,
                job.priority_class,
                job.bundles,
                job.strategy,
                job.same_node_group,
                None,
                job.checkpoint_interval_s,
                # A typed trace row asks for its type; an untyped policy has one type for all.
                (job.gpu_type,) if job.gpu_type and self._policy.gpu_types else (),
            ),
            t,
        )
        self._pending_change(record, +1)

    def _finish(self, lease_id: str, t: float) -> bool:
        workload = lease_id.rsplit("#", 1)[0]
        record = self._records[workload]
        if record.lease_id != lease_id:
            return False  # a stale finish from an attempt that was preempted
        self._core.release(lease_id, t, finished=True)
        self._running_change(record, -1)
        record.lease_id = None
        record.remaining_s = 0.0
        record.finish_s = t
        if self._in_window(record.submit_s):
            self._unfinished_window_jobs -= 1
        return True

    def _tick(self, t: float) -> bool:
        assert self._inference is not None
        minute = int(t // 60)
        if t < self._window.end_s:
            self._push(t + 60.0, EventKind.TICK, "")
        target = self._inference.target(minute)
        have = len(self._replicas_running) + len(self._replicas_pending)
        for _ in range(target - have):
            self._replica_seq += 1
            wid = f"inference-{self._replica_seq}"
            record = JobRecord(
                wid, INFERENCE_TEAM, 1, INFERENCE_PRIORITY, t, math.inf, math.inf, None, t, inference=True
            )
            self._records[wid] = record
            self.trace.inference.append(record)
            self._replicas_pending.append(wid)
            self._core.submit(
                GangRequest(
                    wid, INFERENCE_TEAM, WorkloadClass.INFERENCE, INFERENCE_PRIORITY, (1,), PlacementStrategy.PACK
                ),
                t,
            )
            self._pending_change(record, +1)
        for _ in range(have - target):
            if self._replicas_pending:
                wid = self._replicas_pending.pop()
                self._core.cancel(wid, t)
                record = self._records[wid]
                self._pending_change(record, -1)
                record.wait_s += t - record.queued_since
                record.finish_s = t
            else:
                wid = self._replicas_running.pop()
                record = self._records[wid]
                assert record.lease_id is not None
                self._core.release(record.lease_id, t, finished=True)
                self._running_change(record, -1)
                record.lease_id = None
                record.finish_s = t
        return target != have

    def _schedule(self, t: float) -> None:
        for _ in range(16):  # stops free GPUs that the same instant may hand out again
            decisions = self._core.schedule(t)
            self._apply(decisions, t)
            if not decisions.stops:
                return

    def _apply(self, decisions: Decisions, t: float) -> None:
        for start in decisions.starts:
            record = self._records[start.workload_id]
            self._pending_change(record, -1)
            record.lease_id = start.lease_id
            record.attempt_start_s = t
            record.wait_s += t - record.queued_since
            if record.first_start_s is None:
                record.first_start_s = t
            self._running_change(record, +1)
            if record.inference:
                self._replicas_pending.remove(start.workload_id)
                self._replicas_running.append(start.workload_id)
            else:
                self._push(t + record.remaining_s, EventKind.FINISH, start.lease_id)
        for notice in decisions.notices:
            record = self._records[notice.workload_id]
            record.preemptions += 1
            self.trace.preemption_notices += 1
            interval = record.checkpoint_interval_s
            if interval:
                done = t - record.attempt_start_s
                next_ckpt = record.attempt_start_s + math.ceil(done / interval) * interval
                if next_ckpt == t:
                    next_ckpt += interval
                if next_ckpt < notice.stop_deadline:
                    self._push(next_ckpt, EventKind.CHECKPOINT, notice.lease_id)
            self._push(notice.stop_deadline, EventKind.WAKE, notice.lease_id)
        for stop in decisions.stops:
            self._stop(stop.workload_id, stop.lease_id, t)

    def _stop(self, workload: str, lease_id: str, t: float) -> None:
        record = self._records[workload]
        if record.lease_id != lease_id:
            return
        ran = t - record.attempt_start_s
        interval = record.checkpoint_interval_s
        saved = (ran // interval) * interval if interval else 0.0
        record.lost_gpu_s += record.gpus * (ran - saved)
        record.remaining_s = max(0.0, record.remaining_s - saved)
        requeued = self._core.release(lease_id, t)
        self._running_change(record, -1)
        record.lease_id = None
        if requeued:
            record.queued_since = t
            self._pending_change(record, +1)

    # -- metrics bookkeeping ------------------------------------------------------------------
    def _in_window(self, t: float) -> bool:
        return self._window.start_s <= t < self._window.end_s

    def _prio(self, record: JobRecord) -> int:
        return self._policy.priority(record.priority_class).value

    def _running_change(self, record: JobRecord, sign: int) -> None:
        self._fairness.hold(record.team, self._prio(record), sign * record.gpus)

    def _pending_change(self, record: JobRecord, sign: int) -> None:
        if sign > 0:
            self._fairness.queue(record.workload_id, record.team, self._prio(record), record.gpus, record.queued_since)
        else:
            self._fairness.dequeue(record.workload_id, record.team, record.gpus)

    def _advance(self, t: float) -> None:
        if t <= self._now:
            return
        lo = max(self._now, self._window.start_s)
        hi = min(t, self._window.end_s)
        if hi > lo:
            span = hi - lo
            allocated = sum(self._fairness.allocated.values())
            self.trace.allocated_gpu_s += allocated * span
            for team, gpus in self._fairness.allocated.items():
                if gpus:
                    self.trace.served_gpu_s[team] = self.trace.served_gpu_s.get(team, 0.0) + gpus * span
            self._fairness.observe(lo, hi)
            self._add_hourly(lo, hi, allocated)
        self._now = t

    def _add_hourly(self, lo: float, hi: float, allocated: int) -> None:
        hourly = self.trace.hourly_allocated
        while lo < hi:
            index = int((lo - self._window.start_s) // 3600)
            edge = min(hi, self._window.start_s + (index + 1) * 3600.0)
            while len(hourly) <= index:
                hourly.append(0.0)
            hourly[index] += allocated * (edge - lo) / 3600.0
            lo = edge
