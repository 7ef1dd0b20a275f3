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
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import ray

from switchyard.cluster.autoscale import CapacityRequest, capacity_request
from switchyard.cluster.enforcement import GpuAccounting, account, stop_unleased, summarize
from switchyard.cluster.job_launcher import JobLauncher, LaunchedJob
from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_metrics import SchedulerMetrics
from switchyard.cluster.serve_pool import ServePool, is_pool_workload
from switchyard.scheduler.api import LeaseGrant, Notice, Placement, WorkloadSubmission
from switchyard.scheduler.claims import CLAIM_TIMEOUT_S, ClaimOutcome, ClaimPolicy, after_timeout, unclaimed
from switchyard.scheduler.core import Decisions, LeaseState, Node, Scheduler, WorkloadClass
from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.queue_view import WaitLog, queue_rows

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
    # Leases the scheduler ended itself (grace period over, node lost) whose workload stayed
    # queued and is not one it launches: lease id -> workload. The job still holding that
    # lease id says, when it releases it, whether it will come back for the workload.
    ended: dict[str, str] = field(default_factory=dict)
    waits: WaitLog = field(default_factory=WaitLog)  # admissions of the last day, for `status`
    # What each recent `release` answered, so a repeated call (a client retry, or Ray replaying
    # calls after an actor restart) gets the same answer. Lease ids are unique per attempt.
    released: dict[str, bool] = field(default_factory=dict)
    claim_timeouts: dict[str, int] = field(default_factory=dict)  # workload id -> grants it left unclaimed

    def remember_release(self, lease_id: str, requeued: bool, keep: int = 10_000) -> bool:
        self.released[lease_id] = requeued
        while len(self.released) > keep:
            del self.released[next(iter(self.released))]  # the oldest (dicts keep insertion order)
        return requeued

    def __setstate__(self, state: dict[str, Any]) -> None:
        # A journal written before a field existed restores with that field's default.
        defaults = {f.name: f.default_factory() for f in fields(self) if f.default_factory is not MISSING}
        self.__dict__.update({**defaults, **state})


@dataclass
class _Effects:
    """Side effects of one tick, carried out after the lock is released (they do I/O)."""

    launch: list[tuple[str, str, int]] = field(default_factory=list)  # workload, lease, attempt
    admitted: list[str] = field(default_factory=list)  # workloads whose old notices must go
    notify: list[Notice] = field(default_factory=list)
    stop: list[LaunchedJob] = field(default_factory=list)
    stop_claimed: list[tuple[str, str]] = field(default_factory=list)  # workload, Ray job that claimed it


@ray.remote(max_concurrency=16)
class SchedulerActor:
    TICK_S = 0.25
    NODE_REFRESH_S = 2.0
    AUDIT_S = 5.0

    def __init__(
        self,
        policies_dir: str,
        state_dir: str,
        dashboard_url: str | None = None,
        stop_unleased_gpus: bool = False,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
    ) -> None:
        self._claims = ClaimPolicy(timeout_s=claim_timeout_s)
        self._policy = load_policy_file(Path(policies_dir) / "scheduler.yaml").to_policy()
        self._journal = SchedulerJournal(Path(state_dir) / "scheduler.db")
        self._launcher = JobLauncher(dashboard_url) if dashboard_url else None
        self._stop_unleased = stop_unleased_gpus
        self._metrics = SchedulerMetrics()
        self._serve_pool = ServePool(self._policy, self._journal)  # Serve's GPU replicas as inference workloads
        self._lock = threading.Lock()
        self._nodes_lock = threading.Lock()  # one node refresh at a time: a stale list must not undo a newer one
        self._started_at = time.time()
        restored = self._journal.load()
        self._state: LiveState = (
            restored if restored is not None else LiveState(Scheduler(self._policy, (), time.time()))
        )
        if restored is not None:
            log.warning("scheduler restored: %d leases, %d queued", len(restored.grants), restored.core.pending_count())
        self._accounting: GpuAccounting | None = None
        self._last_nodes = 0.0
        self._last_capacity = 0.0
        self._capacity_requested: CapacityRequest | None = None  # None: not asked yet in this incarnation
        self._stopping = threading.Event()
        threading.Thread(target=self._run, name="scheduler-tick", daemon=True).start()
        # The audit reads Ray's state API (slow under load): on its own thread, so it never
        # delays an admission or the handling of a lost node.
        threading.Thread(target=self._run_audit, name="scheduler-audit", daemon=True).start()

    # ------------------------------------------------------------------ interface
    def submit(self, submission: WorkloadSubmission) -> str:
        now = time.time()
        with self._lock:
            self._state.core.submit(submission.gang(), now)
            self._state.submissions[submission.workload_id] = submission
            self._state.queued_since[submission.workload_id] = now
            self._save()
            # Inside the lock: the next tick may admit it, and "admitted" must follow "submitted".
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
                self._state.claim_timeouts.pop(workload_id, None)  # its launch works
                self._save()
            return grant

    def release(self, lease_id: str, finished: bool = True) -> bool:
        now = time.time()
        # A job whose run failed because a node died releases as finished (it crashed). Ray knows
        # the node is gone by then: handle the loss first, so the workload is requeued, not ended.
        self._refresh_nodes(now)
        with self._lock:
            if lease_id in self._state.released:
                return self._state.released[lease_id]
            workload = self._workload_of(lease_id)
            if workload is None:
                outcome = self._state.remember_release(lease_id, self._release_ended(lease_id, finished, now))
                self._save()
                return outcome
            requeued = self._state.core.release(lease_id, now, finished=finished)
            self._state.remember_release(lease_id, requeued)
            self._forget_lease(workload, requeued, now)
            self._save()
            # Inside the lock, as for "submitted": a requeued workload may be admitted next tick.
            self._journal.event(
                "requeued" if requeued else "released", workload, self._team_of(workload), now, lease_id=lease_id
            )
        return requeued

    def preemption_notice(self, workload_id: str) -> Notice | None:
        with self._lock:
            return self._state.notices.get(workload_id)

    def report_resume(self, workload_id: str, step: int, checkpoint: str) -> None:
        """The job restored `checkpoint` at `step`: the event log shows where a preempted or
        requeued job picked up (operators, and the demo's cause chain)."""
        self._journal.event(
            "resumed", workload_id, self._team_of(workload_id), time.time(), step=step, checkpoint=checkpoint
        )

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
            self._journal.event("cancelled", workload_id, self._team_of(workload_id), now)

    def list_workloads(self) -> list[dict[str, Any]]:
        now = time.time()
        with self._lock:
            core = self._state.core
            queue = queue_rows(core.pending(), core.explain_pending, now)
            out = []
            for wid, sub in self._state.submissions.items():
                lease = core.lease_of(wid)
                waiting = queue.get(wid)
                state = "queued" if waiting is not None else (lease.state.value if lease else "done")
                out.append(
                    {
                        "workload_id": wid,
                        "team": sub.team,
                        "priority_class": sub.priority_class,
                        "gpus": sum(sub.bundles),
                        "state": state,
                        "description": sub.description,
                        "ray_job": self._state.launched[wid].submission_id if wid in self._state.launched else None,
                        "attempt": waiting.attempt if waiting else self._state.attempts.get(wid, 0),
                        "waited_s": round(waiting.waited_s, 1) if waiting else None,
                        "queue_position": waiting.position if waiting else None,
                        "waiting_for": f"{waiting.reason}: {waiting.detail}" if waiting else None,
                    }
                )
            return out

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        return self._journal.events(workload_id)

    def status(self) -> dict[str, Any]:
        now = time.time()
        with self._lock:
            snap = self._state.core.snapshot(now)
            queued = self._state.core.pending()
            pending = [p.request.workload_id for p in queued]
            waits = self._state.waits.summary(now, [(p.request.team, now - p.queued_at) for p in queued])
            serve_pool = self._serve_pool.report(self._state, now)
        accounting = self._accounting
        return {
            "total_gpus": snap.total_gpus,
            "free_gpus": snap.free_gpus,
            "teams": [asdict(t) for t in snap.teams],
            "pools": [asdict(p) for p in snap.pools],
            "leases": [asdict(lease) for lease in snap.leases],
            "pending": pending,
            "outside_leases": summarize(accounting) if accounting is not None else None,
            "serve_pool": serve_pool,
            "waits": waits,
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

    def _run_audit(self) -> None:
        while not self._stopping.wait(self.AUDIT_S):
            try:
                self._audit_gpu_use()
            except Exception:  # as for a tick: logged, and the next audit runs
                log.exception("GPU audit failed")

    def _tick(self, now: float) -> None:
        if now - self._last_nodes >= self.NODE_REFRESH_S:
            self._refresh_nodes(now)
            self._last_nodes = now
        replicas = self._serve_pool.observe(now)  # Ray's view of Serve's replicas, when due (I/O: unlocked)
        with self._lock:
            pool_changed = replicas is not None and self._serve_pool.reconcile(self._state, replicas, now)
            started = time.perf_counter()
            decisions = self._state.core.schedule(now)
            self._metrics.decided(time.perf_counter() - started)
            self._serve_pool.record(self._state, decisions, now)  # before the notices it causes
            effects = self._apply(decisions, now) if decisions else _Effects()
            timed_out = self._reclaim_unclaimed(effects, now)
            if decisions or pool_changed or timed_out:
                self._save()
            self._export_gauges(now)
        self._carry_out(effects, now)
        if now - self._last_capacity >= self.NODE_REFRESH_S:
            self._last_capacity = now
            self._request_capacity()

    def _reclaim_unclaimed(self, effects: _Effects, now: float) -> bool:
        """Grants left unclaimed past the claim timeout: their GPUs back, the workload requeued
        (or ended after `max_timeouts`); a slow launch that did start is stopped."""
        s = self._state

        def needs_claim(workload: str) -> bool:
            return s.submissions[workload].workload_class is not WorkloadClass.INFERENCE

        late = unclaimed(s.grants, s.claims, needs_claim, now, self._claims)
        for workload in late:
            grant, sub = s.grants[workload], s.submissions[workload]
            self._stop_job_of(workload, effects)
            s.core.release(grant.lease_id, now, finished=True)
            self._forget_lease(workload, requeued=False, now=now)
            outcome = after_timeout(s.claim_timeouts.get(workload, 0), self._claims)
            self._journal.event(
                "claim_timeout", workload, sub.team, now, lease_id=grant.lease_id, outcome=outcome.value
            )
            if outcome is ClaimOutcome.END:
                s.claim_timeouts.pop(workload, None)
                self._drop_workload(workload)
                self._journal.event("ended", workload, sub.team, now, reason="its grants were never claimed")
                continue
            s.claim_timeouts[workload] = s.claim_timeouts.get(workload, 0) + 1
            s.core.submit(sub.gang(), now)
            s.queued_since[workload] = now
            self._journal.event("requeued", workload, sub.team, now, lease_id=grant.lease_id, reason="claim_timeout")
        return bool(late)

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
            s.waits.record(sub.team, now, waited)
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
            # Stop orders come when the grace period ran out or on cancel: stop the Ray job.
            job_gone = self._stop_job_of(stop.workload_id, effects)
            team = s.submissions[stop.workload_id].team
            self._journal.event("stop_order", stop.workload_id, team, now, reason=stop.reason)
            lease = s.core.leases().get(stop.lease_id)
            if lease is not None:
                # Its GPUs go back now, requeueing it unless it was cancelled or its job, which
                # the scheduler did not launch and cannot relaunch, is being stopped.
                finished = stop.reason == "cancelled" or lease.state is not LeaseState.PREEMPTING or job_gone
                requeued = s.core.release(stop.lease_id, now, finished=finished)
                self._forget_lease(stop.workload_id, requeued, now)
                if requeued and stop.workload_id not in s.launched:
                    s.ended[stop.lease_id] = stop.workload_id
                self._journal.event(
                    "requeued" if requeued else "released", stop.workload_id, team, now, lease_id=stop.lease_id
                )
        return effects

    def _carry_out(self, effects: _Effects, now: float) -> None:
        from switchyard.train.ray_preemption import GcsPreemptionChannel

        channel = GcsPreemptionChannel()
        for workload in effects.admitted:
            # A requeued job's last notice must not stop its next run at the first step. Serve
            # replicas have no channel (and ids a channel key cannot hold): an exception here
            # used to abort the whole tick's effects, notices to victims included.
            if not is_pool_workload(workload):
                channel.clear(workload)
        for notice in effects.notify:
            channel.send_notice(notice.workload_id, notice.reason, notice.stop_deadline)
        for job in effects.stop:
            if self._launcher is not None and self._launcher.stop(job):
                self._journal.event(
                    "job_stopped", job.workload_id, self._team_of(job.workload_id), now, ray_job=job.submission_id
                )
        for workload, ray_job in effects.stop_claimed:
            stopped = self._launcher.stop_ray_job(ray_job) if self._launcher is not None else None
            if stopped is None:
                # A driver started by hand: Ray offers no way to stop it from here. Its GPUs now
                # count as use outside any lease (the audit reports and, if configured, frees them).
                log.warning("workload %s: cannot stop Ray job %s (not a submitted job)", workload, ray_job)
            else:
                self._journal.event("job_stopped", workload, self._team_of(workload), now, ray_job=stopped)
        for workload, lease_id, attempt in effects.launch:
            sub = self._state.submissions[workload]
            if self._launcher is None or sub.entrypoint is None:
                log.error("workload %s wants launching but the scheduler has no dashboard address", workload)
                continue
            job = self._launcher.launch(workload, lease_id, attempt, sub.entrypoint, sub.runtime_env)
            with self._lock:
                self._state.launched[workload] = job
                self._save()

    def _request_capacity(self) -> None:
        """Ask Ray's autoscaler for room for the gangs that wait for capacity, or clear the request
        when none does (see `switchyard.cluster.autoscale`). Only when it changes: each call
        replaces the last."""
        from ray.autoscaler.sdk import request_resources

        with self._lock:
            core = self._state.core
            request = capacity_request(
                (lease.request.bundles for lease in core.leases().values()), core.waiting_for_capacity()
            )
        if request == self._capacity_requested:
            return
        request_resources(bundles=list(request.bundles), bundle_label_selectors=list(request.label_selectors))
        self._capacity_requested = request
        log.info("autoscaler request: %d GPU bundles", len(request.bundles))

    def _audit_gpu_use(self) -> None:
        with self._lock:
            leased: dict[str, int] = {}
            for workload, job in self._state.claims.items():
                grant = self._state.grants.get(workload)
                gpus = sum(p.gpus for p in grant.placements) if grant is not None else 0
                leased[job] = leased.get(job, 0) + gpus
            address = ray.get_runtime_context().gcs_address
        accounting = account(address, leased)
        self._accounting = accounting
        self._metrics.unleased_gpus.set(accounting.unleased_gpus)
        self._metrics.over_lease_gpus.set(accounting.over_lease_gpus)
        for over in accounting.over_lease:
            log.warning(
                "Ray job %s holds %.0f GPUs, %.0f more than its leases grant",
                over.holding.job_id,
                over.holding.gpus,
                over.excess_gpus,
            )
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
    def _refresh_nodes(self, now: float) -> None:
        with self._nodes_lock:
            self._sync_nodes(cluster_gpu_nodes(), now)

    def _sync_nodes(self, nodes: list[Node], now: float) -> None:
        seen = {n.name: n for n in nodes}
        orphaned: list[LaunchedJob] = []  # launched jobs that lost a node: relaunched when readmitted
        with self._lock:
            s = self._state
            changed = False
            for name in set(s.nodes) - set(seen):
                lost = s.core.remove_node(name, now)
                log.warning("node %s left the cluster; leases %s requeued", name, lost)
                for lease_id in lost:
                    workload = self._workload_of(lease_id)
                    if workload is not None:
                        if workload in s.launched:
                            orphaned.append(s.launched[workload])
                        else:
                            s.ended[lease_id] = workload
                        self._forget_lease(workload, True, now)
                        self._journal.event("node_lost", workload, self._team_of(workload), now, node=name)
                changed = True
            for name, node in seen.items():
                if name not in s.nodes:
                    s.core.add_node(node, now)
                    changed = True
            s.nodes = seen
            if changed:
                self._save()
        for job in orphaned:
            # Its workers on other nodes would keep their GPUs, and its driver would run on:
            # stopped before the requeued workload is launched again.
            if self._launcher is not None and self._launcher.stop(job):
                self._journal.event(
                    "job_stopped", job.workload_id, self._team_of(job.workload_id), now, ray_job=job.submission_id
                )

    def _team_of(self, workload_id: str) -> str:
        sub = self._state.submissions.get(workload_id)
        return sub.team if sub is not None else ""

    def _stop_job_of(self, workload_id: str, effects: _Effects) -> bool:
        """Queue the stop of the Ray job running on `workload_id`'s lease: the job the scheduler
        launched, else the job that claimed the lease, unless that Ray job also claimed other
        leases (a Tune sweep's trials share their driver's job: one trial must not end the
        sweep). Returns True when the job stopped is one the scheduler cannot relaunch."""
        s = self._state
        if workload_id in s.launched:
            effects.stop.append(s.launched[workload_id])
            return False
        job = s.claims.get(workload_id)
        if job is None or any(j == job for w, j in s.claims.items() if w != workload_id):
            return False
        effects.stop_claimed.append((workload_id, job))
        return True

    def _release_ended(self, lease_id: str, finished: bool, now: float) -> bool:
        """A job releases a lease the scheduler already ended (grace period over, node lost). If it
        has finished, nothing will come back for its requeued workload: withdraw it, wherever it
        is now (queued, or admitted again and unclaimed). Returns True when the workload stays
        queued for the job to come back for (what `release` says of a requeued workload)."""
        workload = self._state.ended.pop(lease_id, None)
        if workload is None:
            return False
        if finished:
            try:
                self._state.core.cancel(workload, now)
            except KeyError:
                log.info("workload %s of ended lease %s is gone already", workload, lease_id)
            else:
                if workload not in self._state.grants:
                    self._drop_workload(workload)
                self._journal.event(
                    "cancelled",
                    workload,
                    self._team_of(workload),
                    now,
                    reason="its job finished after the scheduler ended its lease",
                )
        self._save()
        return not finished

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
            self._forget_ended(workload_id)

    def _drop_workload(self, workload_id: str) -> None:
        for table in (self._state.grants, self._state.notices, self._state.claims, self._state.queued_since):
            table.pop(workload_id, None)
        self._forget_ended(workload_id)

    def _forget_ended(self, workload_id: str) -> None:
        """The workload is done: no job will come back for it through an ended lease."""
        ended = self._state.ended
        for lease_id in [lid for lid, w in ended.items() if w == workload_id]:
            del ended[lease_id]

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
        snap = self._state.core.snapshot(now, explain_pending=False)  # every tick: counts only
        self._metrics.gpus.set(snap.free_gpus, tags={"pool": "free"})
        self._metrics.gpus.set(snap.total_gpus - snap.free_gpus, tags={"pool": "leased"})
        states: dict[str, int] = {}
        for lease in snap.leases:
            states[lease.state] = states.get(lease.state, 0) + 1
        for state in ("running", "preempting"):
            self._metrics.leases.set(states.get(state, 0), tags={"state": state})
        for team in snap.teams:
            self._metrics.queued.set(team.queued, tags={"team": team.team})
