"""The live scheduler's rules around the policy core: events in, effects out.

The core (`switchyard.scheduler.core`) decides admissions, notices and stops over abstract
leases. Around it the live scheduler keeps grants with placements, notices, which Ray job
claimed which lease, the jobs it launched, and leases it ended itself (`LiveState`). `Driver`
owns that state and is the one place its rules live: one method per event (a submission, a
claim, a release, the node set Ray reports, a checkpoint, a tick of the clock, the outcome of a
launch), each returning the effects the Ray adapter must carry out (`effects`). No Ray, no
clock (every event carries `now`), no I/O; the adapter holds the lock around each call.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from switchyard.scheduler.api import LeaseGrant, ReleaseOutcome, StopReason, WorkloadSubmission
from switchyard.scheduler.claims import ClaimOutcome, ClaimPolicy, after_timeout, unclaimed
from switchyard.scheduler.core import (
    Decisions,
    LeaseState,
    Node,
    PreemptionDecision,
    Scheduler,
    SchedulerPolicy,
    WorkloadClass,
)
from switchyard.scheduler.core.cordon import hold_node, leases_on, release_node
from switchyard.scheduler.core.state_codec import forget_ended_workloads
from switchyard.scheduler.driver import node_cordons
from switchyard.scheduler.driver.effects import (
    ClearNotice,
    Diagnostic,
    Effect,
    EventKind,
    JournalEvent,
    LaunchJob,
    RecordAdmission,
    RecordPreemption,
    SaveState,
    SendNotice,
    StopClaimedJob,
    StopLaunchedJob,
)
from switchyard.scheduler.driver.node_cordons import DrainReport
from switchyard.scheduler.driver.passes import PassTrigger
from switchyard.scheduler.driver.serve_replicas import ReplicaChange, apply_changes
from switchyard.scheduler.driver.state import LaunchedJob, LiveState
from switchyard.scheduler.driver.tally import LiveTally
from switchyard.scheduler.preemption_channel import PreemptionNotice

HISTORY_RETENTION_S = 86_400.0


class Driver:
    """The live scheduler's state machine; not thread-safe (the adapter's lock serializes calls).

    Deterministic: the same events with the same `now`s, from the same state, give the same
    state and effects (the write-ahead log's replay depends on it). `retention_s`: how long a
    finished workload stays listed (and its counters kept) before a tick forgets it."""

    def __init__(
        self, state: LiveState, claims: ClaimPolicy | None = None, retention_s: float = HISTORY_RETENTION_S
    ) -> None:
        self._state = state
        self._claims = claims or ClaimPolicy()
        self._retention_s = retention_s
        self._tally = LiveTally.of(state)  # derived from the state: rebuilt, never persisted
        self._passes = PassTrigger()  # derived too: a restarted driver passes at once
        self._generation = 0

    @classmethod
    def empty(
        cls,
        policy: SchedulerPolicy,
        now: float,
        claims: ClaimPolicy | None = None,
        retention_s: float = HISTORY_RETENTION_S,
    ) -> Driver:
        """A scheduler with no nodes yet (the first `nodes_seen` adds them)."""
        return cls(LiveState(Scheduler(policy, (), now)), claims, retention_s)

    @property
    def state(self) -> LiveState:
        """The state, for the journal to persist and for readers (`views`, the Serve pool)."""
        return self._state

    @property
    def tally(self) -> LiveTally:
        """The counts the gauges read and the live fairness timeline (`tally`)."""
        return self._tally

    # ------------------------------------------------------------------ when a pass is due
    @property
    def generation(self) -> int:
        """How many events this driver has applied since it was built (ticks that passed
        included): a reader's cheap "did anything happen since"."""
        return self._generation

    def changed(self) -> None:
        """An event other than a tick was applied: the next pass may decide something new."""
        self._generation += 1
        self._passes.changed()

    def pass_due(self, now: float) -> bool:
        """Whether a tick at `now` should run a scheduling pass (see `passes`)."""
        return self._passes.due(self._state, now, self._claims, self._retention_s)

    # ------------------------------------------------------------------ what callers see
    def lease(self, workload_id: str) -> LeaseGrant | None:
        return self._state.grants.get(workload_id)

    def notice(self, workload_id: str) -> PreemptionNotice | None:
        return self._state.notices.get(workload_id)

    # ------------------------------------------------------------------ events from callers
    def submit(self, submission: WorkloadSubmission, now: float, request_id: str | None = None) -> list[Effect]:
        """Raises ValueError (from the core) for a workload already submitted or a bad request.
        A request id already answered is a retried call: nothing happens again."""
        s = self._state
        if request_id is not None and request_id in s.answered:
            return []
        s.core.submit(submission.gang(), now)
        s.submissions[submission.workload_id] = submission
        s.queued_since[submission.workload_id] = now
        s.finished_at.pop(submission.workload_id, None)
        s.remember_request(request_id, submission.workload_id)
        details = {"gpus": sum(submission.bundles), "priority_class": submission.priority_class}
        submitted = JournalEvent(EventKind.SUBMITTED, submission.workload_id, submission.team, now, details)
        return self._tallied(now, [SaveState(), submitted])

    def cancel(self, workload_id: str, now: float, request_id: str | None = None) -> list[Effect]:
        """A queued workload is withdrawn now; a running one gets a stop order on the next tick.
        Raises KeyError for a workload the core does not know, unless the request id says this
        is a retry of a cancel done already."""
        s = self._state
        if request_id is not None and request_id in s.answered:
            return []
        s.core.cancel(workload_id, now)
        if workload_id not in s.grants:
            s.drop_workload(workload_id, now)
        s.remember_request(request_id, workload_id)
        cancelled = JournalEvent(EventKind.CANCELLED, workload_id, s.team_of(workload_id), now)
        return self._tallied(now, [SaveState(), cancelled])

    def claim(
        self, workload_id: str, ray_job_id: str, lease_id: str | None = None
    ) -> tuple[LeaseGrant | None, list[Effect]]:
        """A job says it is using its lease (so its GPU use is accounted to the lease).
        `lease_id`: the lease a launched job was launched for. Raises ValueError for a job that
        would share GPUs with another: one launched for a lease that is over (an attempt that
        started after its grant was taken back and granted again), or a second Ray job claiming
        a lease another one claimed."""
        s = self._state
        grant = s.grants.get(workload_id)
        if lease_id is not None and (grant is None or grant.lease_id != lease_id):
            now = "is waiting for its next grant" if grant is None else f"holds lease {grant.lease_id}"
            raise ValueError(
                f"workload {workload_id!r}: this job was launched for lease {lease_id}, which is over; "
                f"the workload {now}, which a later attempt runs"
            )
        if grant is None or s.claims.get(workload_id) == ray_job_id:
            return grant, []
        if workload_id in s.claims:
            raise ValueError(
                f"workload {workload_id!r}: lease {grant.lease_id} is claimed by Ray job {s.claims[workload_id]}; "
                f"Ray job {ray_job_id} would run on the same GPUs"
            )
        s.claims[workload_id] = ray_job_id
        s.claim_timeouts.pop(workload_id, None)  # its launch works
        return grant, [SaveState()]

    def release(self, lease_id: str, finished: bool, now: float) -> tuple[ReleaseOutcome, list[Effect]]:
        """A job gives its lease back (it exited). A repeated call gets the first answer."""
        s = self._state
        if lease_id in s.released:
            return ReleaseOutcome.of(s.released[lease_id]), []
        workload = s.workload_of(lease_id)
        if workload is None:
            requeued, effects = self._release_ended(lease_id, finished, now)
            s.remember_release(lease_id, requeued)
            return ReleaseOutcome.of(requeued), self._tallied(now, [SaveState(), *effects])
        requeued = s.core.release(lease_id, now, finished=finished)
        s.remember_release(lease_id, requeued)
        s.forget_lease(workload, requeued, now)
        outcome = ReleaseOutcome.of(requeued)
        return outcome, self._tallied(now, [SaveState(), self._lease_event(outcome, workload, lease_id, now)])

    def checkpoint_reported(self, workload_id: str, now: float, request_id: str | None = None) -> list[Effect]:
        """A retried report (same request id) does not move the checkpoint time again."""
        s = self._state
        if (request_id is not None and request_id in s.answered) or s.core.lease_of(workload_id) is None:
            return []
        s.core.report_checkpoint(workload_id, now)
        s.remember_request(request_id, workload_id)
        return [SaveState()]

    def resume_reported(
        self, workload_id: str, step: int, checkpoint: str, now: float, request_id: str | None = None
    ) -> list[Effect]:
        """Where a preempted or requeued job picked up, for the event log; a retried report (same
        request id) is not journaled twice."""
        s = self._state
        if request_id is not None and request_id in s.answered:
            return []
        s.remember_request(request_id, workload_id)
        details = {"step": step, "checkpoint": checkpoint}
        return [JournalEvent(EventKind.RESUMED, workload_id, s.team_of(workload_id), now, details)]

    # ------------------------------------------------------------------ operators' node commands
    def cordon(self, node: str, now: float, request_id: str | None = None) -> tuple[str, list[Effect]]:
        """No new lease on `node` (an id, or a prefix of one: `NodeLookupError` when it names no
        node or several); its leases run on. Returns the node id."""
        return self._set_cordon(node, True, now, request_id)

    def uncordon(self, node: str, now: float, request_id: str | None = None) -> tuple[str, list[Effect]]:
        """Placements may land on `node` again (notices a drain sent stand). Returns the node id."""
        return self._set_cordon(node, False, now, request_id)

    def _set_cordon(self, node: str, on: bool, now: float, request_id: str | None) -> tuple[str, list[Effect]]:
        s = self._state
        if request_id is not None and request_id in s.answered:
            return s.answered[request_id], []
        name = node_cordons.resolve(s, node)
        s.remember_request(request_id, name)
        if not (node_cordons.cordon(s, name, now) if on else node_cordons.uncordon(s, name)):
            return name, [SaveState()]  # as it was already
        kind = EventKind.NODE_CORDONED if on else EventKind.NODE_UNCORDONED
        return name, [SaveState(), JournalEvent(kind, "", "", now, {"node": name})]

    def drain(
        self, node: str, force: bool, now: float, request_id: str | None = None
    ) -> tuple[DrainReport, list[Effect]]:
        """Cordon `node` and give each lease there that may move a preemption notice (see
        `node_cordons`). A retried call (same request id) reports the node as it is now."""
        s = self._state
        if request_id is not None and request_id in s.answered:
            name = s.answered[request_id]
            return node_cordons.survey(s, name, force, leases_on(s.core, name))[0], []
        name = node_cordons.resolve(s, node)
        report, notices = node_cordons.drain(s, name, force, now)
        s.remember_request(request_id, name)
        details = {
            "node": name,
            "noticed": list(report.noticed),
            "blocking": [b.workload_id for b in report.blocking],
            "force": force,
        }
        effects: list[Effect] = [SaveState(), JournalEvent(EventKind.NODE_DRAINED, "", "", now, details)]
        for notice in notices:
            self._send_notice(notice, now, effects)
        return report, self._tallied(now, effects)

    # ------------------------------------------------------------------ events from Ray
    def nodes_seen(self, nodes: Iterable[Node], now: float) -> list[Effect]:
        """The GPU nodes Ray reports alive now. A lost node's leases are requeued; a job the
        scheduler launched on one is stopped (its workers on other nodes would keep their GPUs,
        its driver would run on) and launched again when the workload is readmitted."""
        s = self._state
        seen = {n.name: n for n in nodes}
        effects: list[Effect] = []
        changed = False
        for name in sorted(set(s.nodes) - set(seen)):
            if name in s.cordons:
                release_node(s.core, name)  # the cordon stays, for the node's return
            lost = s.core.remove_node(name, now)
            effects.append(Diagnostic(f"node {name} left the cluster; leases {lost} requeued"))
            for lease_id in lost:
                workload = s.workload_of(lease_id)
                if workload is None:
                    continue
                team = s.team_of(workload)
                if workload in s.launched:
                    effects.append(StopLaunchedJob(s.launched[workload], team, StopReason.NODE_LOST))
                else:
                    s.ended[lease_id] = workload
                s.forget_lease(workload, True, now)
                effects.append(JournalEvent(EventKind.NODE_LOST, workload, team, now, {"node": name}))
            changed = True
        for name, node in seen.items():
            if name not in s.nodes:
                s.core.add_node(node, now)
                if name in s.cordons:
                    hold_node(s.core, name)  # a cordoned node that came back takes no lease either
                changed = True
        s.nodes = seen
        return self._tallied(now, [SaveState(), *effects] if changed else effects)

    def serve_replicas(self, changes: Iterable[ReplicaChange], now: float) -> tuple[dict[str, str], list[Effect]]:
        """Serve's GPU replicas queued, adopted where Ray placed them, released or withdrawn, as
        the Serve pool planned (`serve_replicas`). Returns the adoptions refused (workload id ->
        why: those replicas run outside any lease)."""
        refused, effects = apply_changes(self._state, changes, now)
        return refused, self._tallied(now, [SaveState(), *effects])

    def job_launched(self, workload_id: str, submission_id: str) -> list[Effect]:
        """The adapter's `LaunchJob` went through: stopped as this Ray job from now on."""
        self._state.launched[workload_id] = LaunchedJob(workload_id, submission_id)
        return [SaveState()]

    def launch_failed(self, workload_id: str, lease_id: str, error: str, now: float) -> list[Effect]:
        """The adapter's `LaunchJob` raised. The grant stays: a failed launch is a lost launch,
        which the claim timeout takes back (requeued, ended after `max_timeouts` in a row).
        Taking it back at once would spend those strikes within a second of ticks, so a Jobs API
        that is down for a few seconds would end the workload."""
        s = self._state
        grant = s.grants.get(workload_id)
        if grant is None or grant.lease_id != lease_id:
            return [Diagnostic(f"launch of workload {workload_id} on lease {lease_id} failed ({error}); ended since")]
        details = {"lease_id": lease_id, "error": error}
        return [JournalEvent(EventKind.LAUNCH_FAILED, workload_id, s.team_of(workload_id), now, details)]

    def grant_displaced(self, workload_id: str, lease_id: str, error: str, now: float) -> list[Effect]:
        """The adapter could not hold a grant's GPUs against Serve: Ray placed a Serve replica
        on them before the hold formed (docs/live_scheduler.md, "Granted GPUs are held"). The
        grant is void before any job used it: its GPUs go back (the Serve pool adopts the
        replica on them), a launch that went ahead is stopped, and the workload is queued again
        (its next admission is a new attempt: a Ray job's submission id is per attempt). Not a
        claim-timeout strike: nothing is wrong with the workload.
        A grant already claimed keeps its lease: its job is running, and the replica counts
        as GPU use outside any lease."""
        s = self._state
        grant = s.grants.get(workload_id)
        if grant is None or grant.lease_id != lease_id or workload_id in s.claims:
            why = "ended since" if grant is None or grant.lease_id != lease_id else "claimed already: kept"
            return [Diagnostic(f"hold of workload {workload_id}'s lease {lease_id} failed ({error}); {why}")]
        effects: list[Effect] = []
        self._stop_job_of(workload_id, StopReason.GRANT_DISPLACED, effects)
        s.core.release(lease_id, now, finished=True)
        s.forget_lease(workload_id, requeued=True, now=now)
        s.launched.pop(workload_id, None)  # launched again on its next admission
        s.core.submit(s.submissions[workload_id].gang(), now)
        team = s.team_of(workload_id)
        displaced = {"lease_id": lease_id, "error": error}
        effects.append(JournalEvent(EventKind.GRANT_DISPLACED, workload_id, team, now, displaced))
        requeued = {"lease_id": lease_id, "reason": "grant_displaced"}
        effects.append(JournalEvent(EventKind.REQUEUED, workload_id, team, now, requeued))
        return self._tallied(now, [SaveState(), *effects])

    def job_exited(self, workload_id: str, submission_id: str, status: str, now: float) -> list[Effect]:
        """The Ray job launched for the workload's current, claimed lease has ended (`status`:
        SUCCEEDED, FAILED or STOPPED) without releasing it: a crash, or a release lost with the
        process. The scheduler releases the lease on its behalf, as the job would have: the
        workload is over (its own exit), or requeued when it was under a preemption notice
        (the job stopped for the notice; it is launched again). A job that released first
        (the usual case) has no lease left, and nothing happens."""
        s = self._state
        job, grant = s.launched.get(workload_id), s.grants.get(workload_id)
        if job is None or job.submission_id != submission_id or grant is None or workload_id not in s.claims:
            return []
        noticed = workload_id in s.notices
        details = {"lease_id": grant.lease_id, "ray_job": submission_id, "status": status}
        exited = JournalEvent(EventKind.JOB_EXITED, workload_id, s.team_of(workload_id), now, details)
        _, effects = self.release(grant.lease_id, finished=not noticed, now=now)
        return [exited, *effects]

    # ------------------------------------------------------------------ the clock
    def tick(self, now: float, on_decisions: Callable[[Decisions], None] | None = None) -> list[Effect]:
        """One scheduling pass: the core's decisions applied, then grants left unclaimed past
        the claim timeout taken back. `on_decisions` sees the decisions before they are applied
        (the Serve pool journals each reclaim before the notices it causes)."""
        self._passes.passed(now)
        self._generation += 1
        decisions = self._state.core.schedule(now)
        if on_decisions is not None:
            on_decisions(decisions)
        effects = self._apply(decisions, now) if decisions else []
        timed_out = self._reclaim_unclaimed(effects, now)
        pruned = self._state.prune_finished(now - self._retention_s)
        if pruned:
            forget_ended_workloads(self._state.core, set(pruned))
        return self._tallied(now, [SaveState(), *effects] if decisions or timed_out or pruned else effects)

    # ------------------------------------------------------------------ the rules
    def _apply(self, decisions: Decisions, now: float) -> list[Effect]:
        s = self._state
        effects: list[Effect] = []
        for start in decisions.starts:
            wid = start.workload_id
            sub = s.submissions[wid]
            s.grants[wid] = s.grant(start.lease_id, sub, start.placement, start.borrowing, now)
            s.notices.pop(wid, None)
            effects.append(ClearNotice(wid))
            s.attempts[wid] = s.attempts.get(wid, 0) + 1
            waited = now - s.queued_since.pop(wid, now)
            effects.append(RecordAdmission(sub.team, sub.priority_class, sum(sub.bundles), waited))
            s.waits.record(sub.team, now, waited)
            details = {"lease_id": start.lease_id, "waited_s": round(waited, 3), "nodes": list(start.placement)}
            effects.append(JournalEvent(EventKind.ADMITTED, wid, sub.team, now, details))
            if sub.entrypoint is not None:
                s.launched.pop(wid, None)  # a job of an earlier attempt is not this lease's job
                effects.append(LaunchJob(wid, start.lease_id, s.attempts[wid], sub.entrypoint, sub.runtime_env))
        for notice in decisions.notices:
            self._send_notice(notice, now, effects)
        for stop in decisions.stops:
            self._stop(stop.workload_id, stop.lease_id, node_cordons.stop_reason(s, stop), now, effects)
        return effects

    def _send_notice(self, decision: PreemptionDecision, now: float, effects: list[Effect]) -> None:
        """The notice for a lease the core put under notice (a preemption's victim, or a drained
        node's lease): kept, to answer `notice`, and posted to the job's channel."""
        s = self._state
        wid = decision.workload_id
        sub = s.submissions[wid]
        sent = PreemptionNotice(
            job_id=wid,
            reason=f"{decision.reason.value} for {decision.preemptor}",
            deadline=decision.stop_deadline,
            sent_at=now,
            lease_id=decision.lease_id,
        )
        s.notices[wid] = sent
        effects.append(SendNotice(sent))
        effects.append(RecordPreemption(sub.team, decision.reason.value, decision.lost_gpu_seconds))
        details = {
            "reason": sent.reason,
            "preemptor": decision.preemptor,
            "lost_gpu_s": round(decision.lost_gpu_seconds, 1),
        }
        effects.append(JournalEvent(EventKind.PREEMPTION_NOTICE, wid, sub.team, now, details))

    def _stop(self, workload_id: str, lease_id: str, reason: StopReason, now: float, effects: list[Effect]) -> None:
        """A stop order (grace period over, or cancelled): stop the Ray job, and give the GPUs
        back now, requeueing the workload unless it was cancelled or its job, which the
        scheduler did not launch and cannot relaunch, is being stopped."""
        s = self._state
        job_gone = self._stop_job_of(workload_id, reason, effects)
        team = s.submissions[workload_id].team
        effects.append(JournalEvent(EventKind.STOP_ORDER, workload_id, team, now, {"reason": reason.value}))
        lease = s.core.leases().get(lease_id)
        if lease is None:
            return
        finished = reason is StopReason.CANCELLED or lease.state is not LeaseState.PREEMPTING or job_gone
        requeued = s.core.release(lease_id, now, finished=finished)
        s.forget_lease(workload_id, requeued, now)
        if requeued and workload_id not in s.launched:
            s.ended[lease_id] = workload_id
        effects.append(self._lease_event(ReleaseOutcome.of(requeued), workload_id, lease_id, now))

    def _stop_job_of(self, workload_id: str, reason: StopReason, effects: list[Effect]) -> bool:
        """Stop the Ray job running on `workload_id`'s lease: the job the scheduler launched, else
        the job that claimed the lease, unless that Ray job also claimed other leases (a Tune
        sweep's trials share their driver's job: one trial must not end the sweep). Returns True
        when the job stopped is one the scheduler cannot relaunch."""
        s = self._state
        team = s.team_of(workload_id)
        if workload_id in s.launched:
            effects.append(StopLaunchedJob(s.launched[workload_id], team, reason))
            return False
        job = s.claims.get(workload_id)
        if job is None or any(j == job for w, j in s.claims.items() if w != workload_id):
            return False
        effects.append(StopClaimedJob(workload_id, job, team, reason))
        return True

    def _release_ended(self, lease_id: str, finished: bool, now: float) -> tuple[bool, list[Effect]]:
        """A job releases a lease the scheduler already ended (grace period over, node lost). If it
        has finished, nothing will come back for its requeued workload: withdraw it, wherever it
        is now (queued, or admitted again and unclaimed). Returns True when the workload stays
        queued for the job to come back for (what `release` says of a requeued workload)."""
        s = self._state
        workload = s.ended.pop(lease_id, None)
        if workload is None or not finished:
            return workload is not None, []
        try:
            s.core.cancel(workload, now)
        except KeyError:
            return False, [Diagnostic(f"workload {workload} of ended lease {lease_id} is gone already", warning=False)]
        if workload not in s.grants:
            s.drop_workload(workload, now)
        why = {"reason": "its job finished after the scheduler ended its lease"}
        return False, [JournalEvent(EventKind.CANCELLED, workload, s.team_of(workload), now, why)]

    def _reclaim_unclaimed(self, effects: list[Effect], now: float) -> bool:
        """Grants left unclaimed past the claim timeout go back (see `_take_back`). Serve's
        replicas are placed, not claimed: exempt."""
        s = self._state

        def needs_claim(workload: str) -> bool:
            return s.submissions[workload].workload_class is not WorkloadClass.INFERENCE

        late = unclaimed(s.grants, s.claims, needs_claim, now, self._claims)
        for workload in late:
            self._take_back(workload, now, effects)
        return bool(late)

    def _take_back(self, workload: str, now: float, effects: list[Effect]) -> None:
        """A grant nobody used in time: its GPUs back, a launch that did start late stopped, and
        the workload requeued as a new attempt, or ended after `max_timeouts` such grants in a
        row (so a launch that can never work does not loop)."""
        s = self._state
        grant, sub = s.grants[workload], s.submissions[workload]
        self._stop_job_of(workload, StopReason.CLAIM_TIMEOUT, effects)
        s.core.release(grant.lease_id, now, finished=True)
        s.forget_lease(workload, requeued=False, now=now)
        outcome = after_timeout(s.claim_timeouts.get(workload, 0), self._claims)
        details = {"lease_id": grant.lease_id, "outcome": outcome.value}
        effects.append(JournalEvent(EventKind.CLAIM_TIMEOUT, workload, sub.team, now, details))
        if outcome is ClaimOutcome.END:
            s.claim_timeouts.pop(workload, None)
            s.drop_workload(workload, now)
            ended = {"reason": "its grants were never claimed"}
            effects.append(JournalEvent(EventKind.ENDED, workload, sub.team, now, ended))
            return
        s.claim_timeouts[workload] = s.claim_timeouts.get(workload, 0) + 1
        s.core.submit(sub.gang(), now)
        s.finished_at.pop(workload, None)
        s.queued_since[workload] = now
        requeued = {"lease_id": grant.lease_id, "reason": "claim_timeout"}
        effects.append(JournalEvent(EventKind.REQUEUED, workload, sub.team, now, requeued))

    def _tallied(self, now: float, effects: list[Effect]) -> list[Effect]:
        """The tally follows the workloads this event journaled: every change to a workload's
        queue or lease is journaled (a rule the randomized tally test checks)."""
        self._tally.advance(now)
        touched = [e.workload_id for e in effects if isinstance(e, JournalEvent) and e.workload_id]
        self._tally.follow(self._state, touched)
        return effects

    def _lease_event(self, outcome: ReleaseOutcome, workload: str, lease_id: str, now: float) -> JournalEvent:
        kind = EventKind.REQUEUED if outcome is ReleaseOutcome.REQUEUED else EventKind.RELEASED
        return JournalEvent(kind, workload, self._state.team_of(workload), now, {"lease_id": lease_id})
