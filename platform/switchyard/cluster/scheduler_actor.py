"""The live scheduler: the policy core as a named, detached Ray actor, the one authority over GPUs.

The rules live in the pure driver (`switchyard.scheduler.driver`): it keeps the core's view of
the cluster and the grants, notices, claims and launched jobs around it, takes events, and
returns effects. This actor is the shell around it: a lock around every driver call, a tick
thread, and the Ray I/O. It feeds the driver Ray's GPU nodes (and their
`switchyard/node-group` labels), calls from jobs and the CLI, and the time (`scheduler_clock`:
the wall clock without its steps); it carries out the effects with Ray's own primitives (a
grant is picked up by the waiting job or launched through the Jobs API, a notice goes through
the training preemption channel, a stop stops the Ray job). What goes through Ray's dashboard (the
state API, the Jobs API) runs off the tick thread: a slow or hung dashboard delays no decision.

Durability: every event the driver takes is appended to the write-ahead log inside the lock
(`scheduler_wal`), and no call returns, and no cluster action is carried out, before the log
is synced past the last record it could have seen (group commit). A snapshot every
`snapshot_every_s` (or `snapshot_every_records`) bounds the replay; a restarted actor loads the
newest one and replays the records after it (`scheduler_recovery`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NoReturn

import ray

from switchyard.cluster.autoscale import (
    GPU_TYPE_LABEL,
    NODE_GROUP_LABEL,
    RACK_LABEL,
    CapacityRequest,
    capacity_request,
)
from switchyard.cluster.enforcement import GpuAccounting, summarize
from switchyard.cluster.gpu_audit import GpuAudit
from switchyard.cluster.grant_holds import GrantHolds
from switchyard.cluster.job_launcher import JobLauncher, LaunchedJob
from switchyard.cluster.jobs_api_outbox import JobsApiOutbox
from switchyard.cluster.preemption_channel import GcsPreemptionChannel
from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.scheduler_metrics import SchedulerMetrics
from switchyard.cluster.scheduler_recovery import recover, snapshot_document, write_snapshot
from switchyard.cluster.scheduler_wal import SnapshotFiles, WalWriteError
from switchyard.cluster.serve_pool import ServePool, is_pool_workload
from switchyard.scheduler.api import LeaseGrant, ReleaseOutcome, StopReason, WorkloadSubmission
from switchyard.scheduler.claims import CLAIM_TIMEOUT_S, ClaimPolicy
from switchyard.scheduler.core import Decisions, Node
from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.driver import Driver, LiveState, inputs, views
from switchyard.scheduler.driver.clock import scheduler_clock
from switchyard.scheduler.driver.driver import HISTORY_RETENTION_S
from switchyard.scheduler.driver.effects import (
    ClearNotice,
    ClusterAction,
    Diagnostic,
    Effect,
    JournalEvent,
    LaunchJob,
    RecordAdmission,
    RecordPreemption,
    SendNotice,
    StopClaimedJob,
    StopLaunchedJob,
    split,
)
from switchyard.scheduler.driver.node_cordons import DrainReport
from switchyard.scheduler.driver.node_refresh import NodeRefresh
from switchyard.scheduler.driver.serve_replicas import ReplicaChange
from switchyard.scheduler.preemption_channel import PreemptionNotice

# LiveState is re-exported: journals written before the driver existed pickled it by this name.
__all__ = ["LiveState", "SchedulerActor", "cluster_gpu_nodes"]

log = logging.getLogger(__name__)


def cluster_gpu_nodes() -> list[Node]:
    """Alive Ray nodes with GPUs, as the core's `Node`s (named by Ray node id). Topology and
    GPU type come from the node's labels (`ray start --labels`): `switchyard/node-group`,
    `switchyard/rack` and, where the policy declares GPU types, `switchyard/gpu-type`."""
    nodes = []
    for n in ray.nodes():
        gpus = int(n.get("Resources", {}).get("GPU", 0))
        if not n.get("Alive") or gpus <= 0:
            continue
        labels = n.get("Labels") or {}
        nodes.append(
            Node(
                n["NodeID"],
                gpus,
                labels.get(NODE_GROUP_LABEL, "default"),
                labels.get(RACK_LABEL, "default"),
                labels.get(GPU_TYPE_LABEL, ""),
            )
        )
    return nodes


def _fail_stop(error: WalWriteError) -> NoReturn:
    """The log could not take an event the driver has applied (a full disk, a failed sync):
    memory is ahead of what a restart would replay, so no answer may be given from it. The
    process exits; Ray restarts the actor (`max_restarts`), which recovers from the log, and
    the caller, never answered, retries (docs/live_scheduler.md, "Durability")."""
    log.critical("the scheduler's write-ahead log failed: %s; exiting so Ray restarts it from the log", error)
    logging.shutdown()
    os._exit(70)  # EX_SOFTWARE; no cleanup may write state from memory


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
        history_retention_s: float = HISTORY_RETENTION_S,
        snapshot_every_s: float = 30.0,
        snapshot_every_records: int = 20_000,
        fixed_nodes: list[dict[str, Any]] | None = None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        """`fixed_nodes`: `Node` fields of a logical cluster to schedule instead of Ray's GPU
        nodes (the benchmark's 1,250 nodes on one machine); never set on a real cluster.
        `wall_clock`: the host's clock, read once at start (tests step it)."""
        claims = ClaimPolicy(timeout_s=claim_timeout_s)
        self._policy = load_policy_file(Path(policies_dir) / "scheduler.yaml").to_policy()
        self._state_dir = state_dir
        self._journal = SchedulerJournal(Path(state_dir) / "scheduler.db")
        self._fixed_nodes = None if fixed_nodes is None else [Node(**n) for n in fixed_nodes]
        self._snapshot_every_s = snapshot_every_s
        self._snapshot_every_records = snapshot_every_records
        self._launcher = JobLauncher(dashboard_url) if dashboard_url else None
        self._jobs_api = JobsApiOutbox()  # launches and stops, in order, off the deciding threads
        self._metrics = SchedulerMetrics()
        self._serve_pool = ServePool(self._policy, self._journal)  # Serve's GPU replicas as inference workloads
        # Granted GPUs held against Serve (none on a logical cluster: no Ray nodes to hold on).
        scheduler_name = ray.get_runtime_context().get_actor_name() or "scheduler"
        self._holds = GrantHolds(scheduler_name) if self._fixed_nodes is None else None
        self._awaiting_hold: dict[str, LaunchJob] = {}  # lease id -> its launch, until the hold forms
        self._lock = threading.Lock()
        self._nodes_lock = threading.Lock()  # one node refresh at a time: a stale list must not undo a newer one
        self._node_refresh = NodeRefresh()  # cheap "same nodes as before" on every release
        self._started_at, started = wall_clock(), time.monotonic()  # which incarnation; how long recovery took

        def driver_of(state: LiveState | None) -> Driver:
            if state is None:
                return Driver.empty(self._policy, wall_clock(), claims, history_retention_s)
            return Driver(state, claims, history_retention_s)

        wal_dir = Path(state_dir) / "scheduler-wal"
        self._snapshots = SnapshotFiles(wal_dir)
        recovered = recover(wal_dir, self._journal, driver_of)
        self._driver, self._wal = recovered.driver, recovered.wal
        self._clock = scheduler_clock(recovered.last_time, wall_clock)  # never behind what the log holds
        self._wal.on_broken = _fail_stop
        self._last_snapshot = (time.monotonic(), recovered.wal.last_seq)
        state = self._driver.state
        if recovered.snapshot_seq or recovered.replayed or recovered.migrated_legacy:
            log.warning(
                "scheduler restored in %.2f s: snapshot after record %d, %d records replayed; %d leases, %d queued",
                time.monotonic() - started,
                recovered.snapshot_seq,
                recovered.replayed,
                len(state.grants),
                state.core.pending_count(),
            )
        if recovered.migrated_legacy:  # the pickle is read once: from now on a snapshot is the base
            self._snapshot()
        self._accounting: GpuAccounting | None = None
        self._audit = GpuAudit(self._launcher, self._metrics, stop_unleased_gpus)
        self._last_nodes = 0.0
        self._last_capacity = 0.0
        self._capacity_requested: CapacityRequest | None = None  # None: not asked yet in this incarnation
        self._stopping = threading.Event()
        threading.Thread(target=self._run, name="scheduler-tick", daemon=True).start()
        # The audit and the Serve pool read Ray's state API (the dashboard: slow under load, or
        # hung): each on its own thread, so neither delays an admission or a lost node's handling.
        threading.Thread(target=self._run_audit, name="scheduler-audit", daemon=True).start()
        threading.Thread(target=self._run_serve_pool, name="scheduler-serve-pool", daemon=True).start()

    # ------------------------------------------------------------------ interface
    # Each call that changes state is one logged event (`_record`); each call returns only once
    # the log is synced past what it saw. `request_id`: a retried call (the typed client's, or
    # Ray's after a restart) with the same id is answered, not done twice.
    def submit(self, submission: WorkloadSubmission, request_id: str | None = None) -> str:
        self._record(inputs.submit(submission, self._clock(), request_id))
        return submission.workload_id

    def lease(self, workload_id: str) -> LeaseGrant | None:
        with self._lock:
            grant, seen = self._driver.lease(workload_id), self._wal.last_seq
        self._wal.wait_durable(seen)
        return grant

    def claim(self, workload_id: str, ray_job_id: str, lease_id: str | None = None) -> LeaseGrant | None:
        """A job says it is using its lease (so its GPU use is accounted to the lease); a job the
        scheduler launched names the lease it was launched for (`Driver.claim`)."""
        grant = self._record(inputs.claim(workload_id, ray_job_id, lease_id))
        assert grant is None or isinstance(grant, LeaseGrant)
        return grant

    def release(self, lease_id: str, finished: bool = True) -> bool:
        # A job whose run failed because a node died releases as finished (it crashed). Ray knows
        # the node is gone by then: handle the loss first, so the workload is requeued, not ended.
        self._refresh_nodes(self._clock())
        return self._record(inputs.release(lease_id, finished, self._clock())) is ReleaseOutcome.REQUEUED

    def preemption_notice(self, workload_id: str) -> PreemptionNotice | None:
        with self._lock:
            notice, seen = self._driver.notice(workload_id), self._wal.last_seq
        self._wal.wait_durable(seen)
        return notice

    def report_resume(self, workload_id: str, step: int, checkpoint: str, request_id: str | None = None) -> None:
        """The job restored `checkpoint` at `step`: the event log shows where a preempted or
        requeued job picked up (operators, and the demo's cause chain)."""
        self._record(inputs.resume_reported(workload_id, step, checkpoint, self._clock(), request_id))

    def report_checkpoint(self, workload_id: str, request_id: str | None = None) -> None:
        self._record(inputs.checkpoint_reported(workload_id, self._clock(), request_id))

    # Operators' node commands (`switchyard nodes ...`): `node` is an id or a prefix of one; an
    # unknown or ambiguous one raises `NodeLookupError` (one line for the CLI).
    def cordon(self, node: str, request_id: str | None = None) -> str:
        found = self._record(inputs.cordon(node, self._clock(), request_id))
        assert isinstance(found, str)
        return found

    def uncordon(self, node: str, request_id: str | None = None) -> str:
        found = self._record(inputs.uncordon(node, self._clock(), request_id))
        assert isinstance(found, str)
        return found

    def drain(self, node: str, force: bool = False, request_id: str | None = None) -> DrainReport:
        report = self._record(inputs.drain(node, force, self._clock(), request_id))
        assert isinstance(report, DrainReport)
        return report

    def nodes(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, seen = views.node_rows(self._driver.state), self._wal.last_seq
        self._wal.wait_durable(seen)
        return rows

    def cancel(self, workload_id: str, request_id: str | None = None) -> None:
        self._record(inputs.cancel(workload_id, self._clock(), request_id))

    def list_workloads(self) -> list[dict[str, Any]]:
        with self._lock:
            rows, seen = views.workload_rows(self._driver.state, self._clock()), self._wal.last_seq
        self._wal.wait_durable(seen)
        return rows

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        return self._journal.events(workload_id)

    def status(self) -> dict[str, Any]:
        now = self._clock()
        with self._lock:
            state = self._driver.state
            cluster = views.cluster_view(state, now)
            waits = views.wait_summary(state, now)
            serve_pool = self._serve_pool.report(state, now)
            cordoned = views.node_rows(state, cordoned_only=True)
            fairness = self._driver.tally.fairness(now)
            seen = self._wal.last_seq
        self._wal.wait_durable(seen)
        accounting = self._accounting
        return {
            **cluster,
            "outside_leases": summarize(accounting) if accounting is not None else None,
            "serve_pool": serve_pool,
            "waits": waits,
            "cordoned_nodes": cordoned,
            "fairness": fairness,
            "jobs_api_backlog": self._jobs_api.backlog,
        }

    def ping(self) -> float:
        """When this incarnation of the actor started (changes when Ray restarts it)."""
        return self._started_at

    def state_dir(self) -> str:
        """The platform's state dir this scheduler keeps its journal in (`up --address` checks
        that a cluster's scheduler is its own platform's)."""
        return self._state_dir

    def pid(self) -> int:
        """This incarnation's process id (the benchmark and the WAL test kill it)."""
        return os.getpid()

    # ------------------------------------------------------------------ the loops
    def _run(self) -> None:
        while not self._stopping.wait(self.TICK_S):
            try:
                self._tick(self._clock())
            except Exception:  # a bad tick must not kill the scheduler; it is logged with its traceback
                log.exception("scheduler tick failed")

    def _run_audit(self) -> None:
        while not self._stopping.wait(self.AUDIT_S):
            try:
                self._watch_launched_jobs()
                self._audit_gpu_use()
            except Exception:  # as for a tick: logged, and the next audit runs
                log.exception("GPU audit failed")

    def _run_serve_pool(self) -> None:
        while not self._stopping.wait(ServePool.REFRESH_S):
            try:
                self._reconcile_serve_pool()
            except Exception:  # as for a tick: logged, and the next refresh runs
                log.exception("Serve pool refresh failed")

    def _reconcile_serve_pool(self) -> None:
        """Adopt, queue and release Serve's GPU replicas as the scheduler's inference workloads
        (`switchyard.cluster.serve_pool`)."""
        replicas = self._serve_pool.read()  # the state API: unlocked
        if replicas is None:
            return
        now = self._clock()  # after the read, which may have been slow
        actions: list[ClusterAction] = []
        seq = None
        with self._lock:
            state = self._driver.state

            def log_changes(changes: list[ReplicaChange]) -> Mapping[str, str]:
                nonlocal seq
                refused, more, seq = self._log(inputs.serve_replicas(changes, now))
                actions.extend(more)
                assert isinstance(refused, dict)
                return refused

            self._serve_pool.reconcile(state, replicas, now, log_changes, self._driver.generation)
        if seq is not None:
            self._wal.wait_durable(seq)
        self._carry_out(actions)

    def _watch_launched_jobs(self) -> None:
        """A launched job that ended while holding its claimed lease gives the lease back
        through the driver (`job_exited`): nothing else would."""
        with self._lock:
            watched = views.launched_jobs_on_claimed_leases(self._driver.state)
        for ended in self._audit.ended_jobs(watched):  # Jobs API: unlocked
            self._record(inputs.job_exited(ended.workload_id, ended.submission_id, ended.status, self._clock()))

    def _tick(self, now: float) -> None:
        if now - self._last_nodes >= self.NODE_REFRESH_S:
            self._refresh_nodes(now)
            self._last_nodes = now
        actions: list[ClusterAction] = []
        seq = None
        with self._lock:
            state = self._driver.state
            if self._driver.pass_due(now):  # event-driven: see `scheduler.driver.passes`
                started = time.perf_counter()

                def decided(decisions: Decisions) -> None:
                    self._metrics.decided(time.perf_counter() - started)
                    self._serve_pool.record(state, decisions, now)  # before the notices it causes

                _, more, seq = self._log(inputs.tick(now), decided)
                actions.extend(more)
            self._metrics.show(views.gauge_readings(state, self._driver.tally, now))
        if seq is not None:
            self._wal.wait_durable(seq)
        self._hold_grants(now)  # before any launch: a launch waits for its grant's hold
        self._carry_out(actions)
        if now - self._last_capacity >= self.NODE_REFRESH_S:
            self._last_capacity = now
            self._request_capacity()
        self._snapshot_if_due()

    def _hold_grants(self, now: float) -> None:
        """Make the holds match the grants, launch the jobs whose holds formed, and displace the
        grants whose holds could not form. Tick thread only."""
        if self._holds is None:
            return
        with self._lock:
            wanted = views.held_grants(self._driver.state, is_pool_workload)
        failed = self._holds.reconcile(wanted)  # Ray I/O: unlocked
        for lease_id, launch in list(self._awaiting_hold.items()):
            if lease_id not in wanted or lease_id in failed:
                del self._awaiting_hold[lease_id]  # ended, or displaced below: never launched
            elif self._holds.formed(lease_id):
                del self._awaiting_hold[lease_id]
                self._launch(launch)
        for lease_id in failed:
            with self._lock:
                workload = self._driver.state.workload_of(lease_id)
            if workload is not None:
                error = "a Serve replica took the granted GPUs before their hold formed"
                log.warning("workload %s: lease %s displaced: %s", workload, lease_id, error)
                self._record(inputs.grant_displaced(workload, lease_id, error, now))

    def _refresh_nodes(self, now: float) -> None:
        with self._nodes_lock:
            nodes = self._fixed_nodes if self._fixed_nodes is not None else cluster_gpu_nodes()
            with self._lock:
                if self._node_refresh.unchanged(self._driver, nodes):
                    return
            self._record(inputs.nodes_seen(nodes, now))
            self._node_refresh.recorded(nodes)

    # ------------------------------------------------------------------ the log
    def _record(self, record: inputs.Record) -> inputs.Answer:
        """One event: applied, logged and committed in the lock; answered once durable, its
        cluster actions carried out after that. A refused call (the driver raised) is not logged."""
        with self._lock:
            answer, actions, seq = self._log(record)
        self._wal.wait_durable(seq)
        self._carry_out(actions)
        return answer

    def _log(
        self, record: inputs.Record, on_decisions: Callable[[Decisions], None] | None = None
    ) -> tuple[inputs.Answer, list[ClusterAction], int]:
        """Lock held: log and apply the event (`inputs.apply_logged`), and do its bookkeeping.
        Returns the answer, the cluster actions (for after the log is durable and the lock
        released) and the record's sequence number."""
        answer, effects, seq = inputs.apply_logged(self._driver, self._wal, record, on_decisions)
        return answer, self._commit(effects, seq), seq

    def _snapshot_if_due(self) -> None:
        at, seq = self._last_snapshot
        if self._wal.last_seq == seq:
            return
        if time.monotonic() - at >= self._snapshot_every_s or self._wal.last_seq - seq >= self._snapshot_every_records:
            with self._lock:
                document, seq = snapshot_document(self._driver, self._wal, self._clock())
            write_snapshot(self._snapshots, document, seq)  # the document is a copy: no lock needed
            self._last_snapshot = (time.monotonic(), seq)

    def _snapshot(self) -> None:
        """Lock held: a snapshot now, written before the lock is released."""
        document, seq = snapshot_document(self._driver, self._wal, self._clock())
        write_snapshot(self._snapshots, document, seq)
        self._last_snapshot = (time.monotonic(), seq)

    # ------------------------------------------------------------------ effects
    def _commit(self, effects: list[Effect], wal_seq: int | None) -> list[ClusterAction]:
        """Lock held: journal, count and log in order (rows of a logged event carry its seq).
        Returns the cluster actions, to carry out once the log is durable and the lock released."""
        books, actions = split(effects)
        for b in books:
            if isinstance(b, JournalEvent):
                self._journal.event(b.kind.value, b.workload_id, b.team, b.at, wal_seq=wal_seq, **b.details)
            elif isinstance(b, RecordAdmission):
                self._metrics.admitted(b.team, b.priority_class, b.gpus, b.waited_s)
            elif isinstance(b, RecordPreemption):
                self._metrics.preempted(b.team, b.reason, b.lost_gpu_s)
            elif isinstance(b, Diagnostic):
                log.log(logging.WARNING if b.warning else logging.INFO, "%s", b.message)
        return actions

    def _carry_out(self, actions: list[ClusterAction]) -> None:
        for action in actions:
            try:
                self._carry_out_one(action)
            except Exception:  # Ray's APIs raise many types: logged, and one failure must not drop the rest
                log.exception("scheduler: %s failed", type(action).__name__)  # not its repr: runtime envs hold secrets

    def _carry_out_one(self, action: ClusterAction) -> None:
        if isinstance(action, ClearNotice):
            # Serve replicas have no channel (and ids a channel key cannot hold).
            if not is_pool_workload(action.workload_id):
                GcsPreemptionChannel().clear(action.workload_id)
        elif isinstance(action, SendNotice):
            GcsPreemptionChannel().post(action.notice)  # the notice `preemption_notice` answers with
        elif isinstance(action, StopLaunchedJob):
            self._jobs_api.put("StopLaunchedJob", lambda: self._stop_launched(action))
        elif isinstance(action, StopClaimedJob):
            self._jobs_api.put("StopClaimedJob", lambda: self._stop_claimed(action))
        else:
            self._launch(action)

    # Jobs API calls: on the outbox's thread (`_jobs_api`), in the order they were decided.
    def _stop_launched(self, action: StopLaunchedJob) -> None:
        job = LaunchedJob(action.job.workload_id, action.job.submission_id)
        if self._launcher is not None and self._launcher.stop(job):
            self._job_stopped(job.workload_id, action.team, job.submission_id, action.reason)

    def _stop_claimed(self, action: StopClaimedJob) -> None:
        ray_job = action.ray_job_id
        stopped = self._launcher.stop_ray_job(ray_job) if self._launcher is not None else None
        if stopped is None:
            # A driver started by hand: Ray offers no way to stop it from here. Its GPUs now
            # count as use outside any lease (the audit reports and, if configured, frees them).
            why = f"{action.reason}; not a submitted job"
            log.warning("workload %s: cannot stop Ray job %s (%s)", action.workload_id, ray_job, why)
        else:
            self._job_stopped(action.workload_id, action.team, stopped, action.reason)

    def _job_stopped(self, workload_id: str, team: str, submission_id: str, reason: StopReason) -> None:
        log.info("workload %s: stopped Ray job %s (%s)", workload_id, submission_id, reason)
        self._journal.event("job_stopped", workload_id, team, self._clock(), ray_job=submission_id)

    def _launch(self, action: LaunchJob) -> None:
        """Submit the job once its grant's hold has formed, through the outbox."""
        if self._holds is not None and not self._holds.formed(action.lease_id):
            self._awaiting_hold[action.lease_id] = action  # launched by `_hold_grants` once it forms
            return
        self._jobs_api.put("LaunchJob", lambda: self._submit_job(action))

    def _submit_job(self, action: LaunchJob) -> None:
        """Its outcome goes back to the driver (a failed one is journaled, and its grant is the
        claim timeout's to take back). A grant that ended while the launch waited behind a slow
        Jobs API is not launched: nothing would stop its job."""
        with self._lock:
            granted = self._driver.state.workload_of(action.lease_id) == action.workload_id
        if not granted:
            log.info("workload %s: lease %s ended before its launch: not launched", action.workload_id, action.lease_id)
            return
        if self._launcher is None:
            error = "the scheduler has no dashboard address"
            log.error("workload %s wants launching but %s", action.workload_id, error)
        else:
            try:
                job = self._launcher.launch(
                    action.workload_id, action.lease_id, action.attempt, action.entrypoint, action.runtime_env
                )
            except Exception as exc:  # the Jobs API raises several types: logged and journaled
                log.exception("launch of workload %s failed", action.workload_id)
                error = f"{type(exc).__name__}: {exc}"
            else:
                self._record(inputs.job_launched(action.workload_id, job.submission_id))
                return
        self._record(inputs.launch_failed(action.workload_id, action.lease_id, error, self._clock()))

    # ------------------------------------------------------------------ autoscaler and audit
    def _request_capacity(self) -> None:
        """Ask Ray's autoscaler for room for the gangs that wait for capacity, or clear the request
        when none does (see `switchyard.cluster.autoscale`). Only when it changes: each call
        replaces the last."""
        from ray.autoscaler.sdk import request_resources

        with self._lock:
            state = self._driver.state
            request = capacity_request(views.leased_bundles(state), views.waiting_for_capacity(state))
        if request == self._capacity_requested:
            return
        request_resources(bundles=list(request.bundles), bundle_label_selectors=list(request.label_selectors))
        self._capacity_requested = request
        log.info("autoscaler request: %d GPU bundles", len(request.bundles))

    def _audit_gpu_use(self) -> None:
        with self._lock:
            leased = views.leased_gpus_by_job(self._driver.state)
        self._accounting = self._audit.gpu_use(ray.get_runtime_context().gcs_address, leased)
