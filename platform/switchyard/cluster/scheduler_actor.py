"""The live scheduler: the policy core as a named, detached Ray actor, the one authority over GPUs.

It keeps the core's view of the cluster in step with Ray's (GPU nodes and their
`switchyard/node-group` labels), feeds it events from jobs and the CLI, and ticks it. Each
tick's decisions are carried out with Ray's own primitives: a grant is picked up by the
waiting job (or the scheduler launches the job through the Jobs API), a preemption notice goes
through the training preemption channel, a stop order stops the Ray job. Every change is
persisted before anyone can observe it, so a restarted actor resumes its queues and leases.
The core never reads a clock; this adapter passes `time.time()`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import ray

from switchyard.cluster.enforcement import GpuAccounting, account, stop_unleased, summarize
from switchyard.cluster.job_launcher import JobLauncher, LaunchedJob
from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_metrics import SchedulerMetrics
from switchyard.scheduler.api import LeaseGrant, Notice, Placement, WorkloadSubmission
from switchyard.scheduler.core import Decisions, LeaseState, Node, Scheduler
from switchyard.scheduler.core.config import load_policy_file

log = logging.getLogger(__name__)

NODE_GROUP_LABEL = "switchyard/node-group"
RACK_LABEL = "switchyard/rack"


def cluster_gpu_nodes() -> list[Node]:
    """Alive Ray nodes with GPUs, as the core's `Node`s (named by Ray node id)."""
    nodes = []
    for n in ray.nodes():
        gpus = int(n.get("Resources", {}).get("GPU", 0))
        if not n.get("Alive") or gpus <= 0:
            continue
        labels = n.get("Labels") or {}
        nodes.append(
            Node(n["NodeID"], gpus, labels.get(NODE_GROUP_LABEL, "default"), labels.get(RACK_LABEL, "default"))
        )
    return nodes


@dataclass
class LiveState:
    """Everything the actor must get back after a restart (pickled by the journal)."""

    core: Scheduler
    nodes: dict[str, Node] = field(default_factory=dict)
    submissions: dict[str, WorkloadSubmission] = field(default_factory=dict)
    grants: dict[str, LeaseGrant] = field(default_factory=dict)  # workload id -> current lease
    notices: dict[str, Notice] = field(default_factory=dict)
    claims: dict[str, str] = field(default_factory=dict)  # workload id -> Ray job id using the lease
    launched: dict[str, LaunchedJob] = field(default_factory=dict)
    attempts: dict[str, int] = field(default_factory=dict)
    queued_since: dict[str, float] = field(default_factory=dict)


@dataclass
class _Effects:
    """Side effects of one tick, carried out after the lock is released (they do I/O)."""

    launch: list[tuple[str, str, int]] = field(default_factory=list)  # workload, lease, attempt
    admitted: list[str] = field(default_factory=list)  # workloads whose old notices must go
    notify: list[Notice] = field(default_factory=list)
    stop: list[LaunchedJob] = field(default_factory=list)


@ray.remote(max_concurrency=16)
class SchedulerActor:
    TICK_S = 0.25
    NODE_REFRESH_S = 2.0
    AUDIT_S = 5.0

    def __init__(
        self, policies_dir: str, state_dir: str, dashboard_url: str | None = None, stop_unleased_gpus: bool = False
    ) -> None:
        self._policy = load_policy_file(Path(policies_dir) / "scheduler.yaml").to_policy()
        self._journal = SchedulerJournal(Path(state_dir) / "scheduler.db")
        self._launcher = JobLauncher(dashboard_url) if dashboard_url else None
        self._stop_unleased = stop_unleased_gpus
        self._metrics = SchedulerMetrics()
        self._lock = threading.Lock()
        self._started_at = time.time()
        restored = self._journal.load()
        self._state: LiveState = (
            restored if restored is not None else LiveState(Scheduler(self._policy, (), time.time()))
        )
        if restored is not None:
            log.warning("scheduler restored: %d leases, %d queued", len(restored.grants), restored.core.pending_count())
        self._accounting: GpuAccounting | None = None
        self._last_nodes = 0.0
        self._last_audit = 0.0
        self._stopping = threading.Event()
        threading.Thread(target=self._run, name="scheduler-tick", daemon=True).start()

    # ------------------------------------------------------------------ interface
    def submit(self, submission: WorkloadSubmission) -> str:
        now = time.time()
        with self._lock:
            self._state.core.submit(submission.gang(), now)
            self._state.submissions[submission.workload_id] = submission
            self._state.queued_since[submission.workload_id] = now
            self._save()
        self._journal.event(
            "submitted",
            submission.workload_id,
            submission.team,
            now,
            gpus=sum(submission.bundles),
            priority_class=submission.priority_class,
        )
        return submission.workload_id

    def lease(self, workload_id: str) -> LeaseGrant | None:
        with self._lock:
            return self._state.grants.get(workload_id)

    def claim(self, workload_id: str, ray_job_id: str) -> LeaseGrant | None:
        """A job says it is using its lease (so its GPU use is accounted to the lease)."""
        with self._lock:
            grant = self._state.grants.get(workload_id)
            if grant is not None and self._state.claims.get(workload_id) != ray_job_id:
                self._state.claims[workload_id] = ray_job_id
                self._save()
            return grant

    def release(self, lease_id: str, finished: bool = True) -> bool:
        now = time.time()
        with self._lock:
            workload = self._workload_of(lease_id)
            if workload is None:
                return False
            requeued = self._state.core.release(lease_id, now, finished=finished)
            self._forget_lease(workload, requeued, now)
            self._save()
        team = self._state.submissions[workload].team if workload in self._state.submissions else ""
        self._journal.event("requeued" if requeued else "released", workload, team, now, lease_id=lease_id)
        return requeued

    def preemption_notice(self, workload_id: str) -> Notice | None:
        with self._lock:
            return self._state.notices.get(workload_id)

    def report_checkpoint(self, workload_id: str) -> None:
        with self._lock:
            if self._state.core.lease_of(workload_id) is not None:
                self._state.core.report_checkpoint(workload_id, time.time())
                self._save()

    def cancel(self, workload_id: str) -> None:
        now = time.time()
        with self._lock:
            self._state.core.cancel(workload_id, now)
            if workload_id not in self._state.grants:
                self._drop_workload(workload_id)
            self._save()
        self._journal.event("cancelled", workload_id, "", now)

    def list_workloads(self) -> list[dict[str, Any]]:
        with self._lock:
            pending = {p.request.workload_id for p in self._state.core.pending()}
            out = []
            for wid, sub in self._state.submissions.items():
                lease = self._state.core.lease_of(wid)
                state = "queued" if wid in pending else (lease.state.value if lease else "done")
                out.append(
                    {
                        "workload_id": wid,
                        "team": sub.team,
                        "priority_class": sub.priority_class,
                        "gpus": sum(sub.bundles),
                        "state": state,
                        "description": sub.description,
                        "ray_job": self._state.launched[wid].submission_id if wid in self._state.launched else None,
                    }
                )
            return out

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        return self._journal.events(workload_id)

    def status(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            snap = self._state.core.snapshot(now)
            pending = [p.request.workload_id for p in self._state.core.pending()]
        accounting = self._accounting
        return {
            "total_gpus": snap.total_gpus,
            "free_gpus": snap.free_gpus,
            "teams": [asdict(t) for t in snap.teams],
            "pools": [asdict(p) for p in snap.pools],
            "leases": [asdict(lease) for lease in snap.leases],
            "pending": pending,
            "outside_leases": summarize(accounting) if accounting is not None else None,
        }

    def ping(self) -> float:
        """When this incarnation of the actor started (changes when Ray restarts it)."""
        return self._started_at

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stopping.wait(self.TICK_S):
            try:
                self._tick(time.time())
            except Exception:  # a bad tick must not kill the scheduler; it is logged with its traceback
                log.exception("scheduler tick failed")

    def _tick(self, now: float) -> None:
        if now - self._last_nodes >= self.NODE_REFRESH_S:
            self._sync_nodes(cluster_gpu_nodes(), now)
            self._last_nodes = now
        with self._lock:
            decisions = self._state.core.schedule(now)
            effects = self._apply(decisions, now) if decisions else _Effects()
            if decisions:
                self._save()
            self._export_gauges(now)
        self._carry_out(effects, now)
        if now - self._last_audit >= self.AUDIT_S:
            self._last_audit = now
            self._audit_gpu_use()

    def _apply(self, decisions: Decisions, now: float) -> _Effects:
        effects = _Effects()
        s = self._state
        for start in decisions.starts:
            sub = s.submissions[start.workload_id]
            s.grants[start.workload_id] = self._grant(start.lease_id, sub, start.placement, start.borrowing, now)
            s.notices.pop(start.workload_id, None)
            effects.admitted.append(start.workload_id)
            s.attempts[start.workload_id] = s.attempts.get(start.workload_id, 0) + 1
            waited = now - s.queued_since.pop(start.workload_id, now)
            self._metrics.admitted(sub.team, sub.priority_class, sum(sub.bundles), waited)
            self._journal.event(
                "admitted",
                start.workload_id,
                sub.team,
                now,
                lease_id=start.lease_id,
                waited_s=round(waited, 3),
                nodes=list(start.placement),
            )
            if sub.entrypoint is not None:
                effects.launch.append((start.workload_id, start.lease_id, s.attempts[start.workload_id]))
        for notice in decisions.notices:
            sub = s.submissions[notice.workload_id]
            n = Notice(
                workload_id=notice.workload_id,
                lease_id=notice.lease_id,
                reason=f"{notice.reason.value} for {notice.preemptor}",
                stop_deadline=notice.stop_deadline,
            )
            s.notices[notice.workload_id] = n
            effects.notify.append(n)
            self._metrics.preempted(sub.team, notice.reason.value, notice.lost_gpu_seconds)
            self._journal.event(
                "preemption_notice",
                notice.workload_id,
                sub.team,
                now,
                reason=n.reason,
                preemptor=notice.preemptor,
                lost_gpu_s=round(notice.lost_gpu_seconds, 1),
            )
        for stop in decisions.stops:
            # A victim that checkpointed after its notice is already on its way out: let it
            # exit cleanly. Stop the Ray job only when the grace period ran out or on cancel.
            if stop.workload_id in s.launched and stop.reason != "checkpointed after notice":
                effects.stop.append(s.launched[stop.workload_id])
            team = s.submissions[stop.workload_id].team
            self._journal.event("stop_order", stop.workload_id, team, now, reason=stop.reason)
            lease = s.core.leases().get(stop.lease_id)
            if lease is not None:
                # Its GPUs go back now, requeueing it unless it was cancelled.
                finished = stop.reason == "cancelled" or lease.state is not LeaseState.PREEMPTING
                requeued = s.core.release(stop.lease_id, now, finished=finished)
                self._forget_lease(stop.workload_id, requeued, now)
                self._journal.event(
                    "requeued" if requeued else "released", stop.workload_id, team, now, lease_id=stop.lease_id
                )
        return effects

    def _carry_out(self, effects: _Effects, now: float) -> None:
        from switchyard.train.ray_preemption import GcsPreemptionChannel

        channel = GcsPreemptionChannel()
        for workload in effects.admitted:
            # A requeued job's last notice must not stop its next run at the first step.
            channel.clear(workload)
        for notice in effects.notify:
            channel.send_notice(notice.workload_id, notice.reason, notice.stop_deadline)
        for job in effects.stop:
            if self._launcher is not None:
                self._launcher.stop(job)
        for workload, lease_id, attempt in effects.launch:
            sub = self._state.submissions[workload]
            if self._launcher is None or sub.entrypoint is None:
                log.error("workload %s wants launching but the scheduler has no dashboard address", workload)
                continue
            job = self._launcher.launch(workload, lease_id, attempt, sub.entrypoint, sub.runtime_env)
            with self._lock:
                self._state.launched[workload] = job
                self._save()

    def _audit_gpu_use(self) -> None:
        with self._lock:
            leased_jobs = set(self._state.claims.values())
            address = ray.get_runtime_context().gcs_address
        accounting = account(address, leased_jobs)
        self._accounting = accounting
        self._metrics.unleased_gpus.set(accounting.unleased_gpus)
        for holding in accounting.unleased:
            log.warning("GPU use outside any lease: Ray job %s holds %.0f GPUs", holding.job_id, holding.gpus)
            if self._stop_unleased:
                for action in stop_unleased(holding):
                    log.warning("enforcement: %s (job %s)", action, holding.job_id)
                # Removing its placement groups frees the GPUs now, but Ray Train would retry
                # forever with new ones: a submitted job is stopped as a whole.
                if self._launcher is not None:
                    stopped = self._launcher.stop_ray_job(holding.job_id)
                    if stopped is not None:
                        log.warning("enforcement: stopped Ray job %s (%s)", stopped, holding.job_id)

    # ------------------------------------------------------------------ helpers (lock held)
    def _sync_nodes(self, nodes: list[Node], now: float) -> None:
        seen = {n.name: n for n in nodes}
        with self._lock:
            s = self._state
            changed = False
            for name in set(s.nodes) - set(seen):
                lost = s.core.remove_node(name, now)
                log.warning("node %s left the cluster; leases %s requeued", name, lost)
                for lease_id in lost:
                    workload = self._workload_of(lease_id)
                    if workload is not None:
                        self._forget_lease(workload, True, now)
                        self._journal.event("node_lost", workload, s.submissions[workload].team, now, node=name)
                changed = True
            for name, node in seen.items():
                if name not in s.nodes:
                    s.core.add_node(node, now)
                    changed = True
            s.nodes = seen
            if changed:
                self._save()

    def _workload_of(self, lease_id: str) -> str | None:
        return next((w for w, g in self._state.grants.items() if g.lease_id == lease_id), None)

    def _forget_lease(self, workload_id: str, requeued: bool, now: float) -> None:
        s = self._state
        s.grants.pop(workload_id, None)
        s.notices.pop(workload_id, None)
        s.claims.pop(workload_id, None)
        if requeued:
            s.queued_since[workload_id] = now
        else:
            s.launched.pop(workload_id, None)

    def _drop_workload(self, workload_id: str) -> None:
        for table in (self._state.grants, self._state.notices, self._state.claims, self._state.queued_since):
            table.pop(workload_id, None)

    def _grant(
        self, lease_id: str, sub: WorkloadSubmission, placement: tuple[str, ...], borrowing: bool, now: float
    ) -> LeaseGrant:
        nodes = self._state.nodes
        return LeaseGrant(
            lease_id=lease_id,
            workload_id=sub.workload_id,
            team=sub.team,
            granted_at=now,
            borrowing=borrowing,
            placements=tuple(
                Placement(node_id=node, node_group=nodes[node].node_group, gpus=gpus)
                for node, gpus in zip(placement, sub.bundles, strict=True)
            ),
        )

    def _save(self) -> None:
        self._journal.save(self._state)

    def _export_gauges(self, now: float) -> None:
        snap = self._state.core.snapshot(now)
        self._metrics.gpus.set(snap.free_gpus, tags={"pool": "free"})
        self._metrics.gpus.set(snap.total_gpus - snap.free_gpus, tags={"pool": "leased"})
        states: dict[str, int] = {}
        for lease in snap.leases:
            states[lease.state] = states.get(lease.state, 0) + 1
        for state in ("running", "preempting"):
            self._metrics.leases.set(states.get(state, 0), tags={"state": state})
        for team in snap.teams:
            self._metrics.queued.set(team.queued, tags={"team": team.team})
