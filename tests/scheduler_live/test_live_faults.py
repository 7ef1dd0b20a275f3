"""Randomized faults against the live scheduler on the fake multi-node cluster (issue 19).

Per seed, `plan(seed)` draws 10-14 steps: submit a workload whose launched job claims its lease
and exits (after releasing it as finished, or crashing without releasing), or never claims it
(a lost launch); cancel one; SIGKILL the actor (Ray restarts it, replaying a submit that was in
flight); repeat a submit, cancel or release already answered, with the same request id, after a
restart; add a GPU node (group c) and remove it. Invariants are checked after every step, while
it settles and at the end (`check_invariants`):

- no GPU booked twice: per node, the leases in the core's snapshot hold at most its GPUs, no
  lease id twice, and no lease stays on a node Ray reports dead; the grant holds Ray has formed
  (state API) belong to live leases;
- no grant unclaimed past the claim timeout (plus a tick and restart slack);
- every submitted workload is listed running, queued, preempting or done, submitted once;
- a workload is done only by its own exit (`released` of a lease its job released, or released
  for it after its job ended: `job_exited`), a cancel
  the test made, or its attempt limit (`ended` after `max_timeouts` claim timeouts), and what
  is done stays done (a repeated submit does not bring it back).

What each fault should produce (docs/live_scheduler.md):

- actor SIGKILL: nothing visible to the workloads; leases, queues and claims come back from the
  write-ahead log, a job's release after the restart is answered (it is not interrupted);
- node removal: the leases there are requeued (`node_lost`), their launched jobs stopped and
  launched again on the next admission;
- a lost launch: the claim timeout takes the grant back and requeues (`claim_timeout`,
  `requeued`); the third in a row ends it (`ended`);
- a repeated call: answered, not done again (no second `submitted`/`cancelled` event; a
  release gets its first answer);
- a job crash (exits without releasing): the scheduler sees its launched job end and releases
  the lease on its behalf (`job_exited`, then `released`: its own exit). Found by this test
  (seed 1): the lease used to stay `running`, holding its GPUs, until a cancel; the final
  check fails for any claimed lease whose job has ended.

Run time on the shared 2-core machine: the default seed 30-45 s (plus the session cluster's
start); heavy mode, `SWITCHYARD_FAULT_SEEDS=5,10,11` (any list, one test per seed), 35-50 s a
seed. A failure prints every violation, the seed, its steps and each workload's events.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
import textwrap
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.job_submission import JobStatus, JobSubmissionClient

from switchyard.cluster.admission import training_submission
from switchyard.cluster.grant_holds import HOLD_NAME_PREFIX, node_resources
from switchyard.cluster.record import SCHEDULER_ACTOR
from switchyard.cluster.scheduler_client import SchedulerClient
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.claims import ClaimPolicy
from tests.scheduler_live.conftest import wait_for

pytestmark = [pytest.mark.ray, pytest.mark.slow]

SEEDS_ENV = "SWITCHYARD_FAULT_SEEDS"
DEFAULT_SEEDS = (1,)  # its steps have every fault kind (see `plan`)
SEEDS = tuple(int(s) for s in os.environ.get(SEEDS_ENV, "").split(",") if s.strip()) or DEFAULT_SEEDS

CLAIM_TIMEOUT_S = 10.0  # a job here claims 2-8 s after its launch (the machine loaded)
MAX_TIMEOUTS = ClaimPolicy().max_timeouts
SLACK_S = 3.0  # a tick, and a restarted actor's recovery before its first tick
SETTLE_S = 35.0  # after the last step: lost launches run out their three claim timeouts
TEAMS = ("research", "vision")
POLICY = """
version: 1
policy: {preemption_grace_s: 2}
priority_classes:
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
teams:
  - name: research
    quotas: [{classes: [training], guaranteed_gpus: 8}]
  - name: vision
    quotas: [{classes: [training], guaranteed_gpus: 8}]
"""

# argv: mode (finish | crash | lost), seconds to hold the lease, the marker directory. Markers
# say what the job did, for the checks: claimed-<lease>, released-<lease>, answer-<lease>.
JOB = textwrap.dedent("""
    import os, sys, time
    from pathlib import Path

    mode, hold_s, marks = sys.argv[1], float(sys.argv[2]), Path(sys.argv[3])
    if mode == "lost":
        sys.exit(0)  # never claims: a lost launch
    import ray
    from switchyard.cluster.admission import admit

    ray.init()
    admission = admit(None)
    lease = admission.grant.lease_id
    (marks / f"claimed-{lease}").touch()
    time.sleep(hold_s)
    if mode == "crash":
        os._exit(3)  # dies holding the lease
    (marks / f"released-{lease}").touch()
    requeued = admission.release(finished=True)
    (marks / f"answer-{lease}").write_text(str(requeued))
""")


@dataclass(frozen=True)
class Step:
    kind: str  # submit | cancel | kill | repeat | add_node | remove_node
    mode: str = ""  # submit: finish | crash | lost
    gpus: int = 0
    team: str = ""
    hold_s: float = 0.0
    target: float = 0.0  # cancel / repeat: which one, as a fraction of those there are then
    in_flight: bool = False  # kill: a submit is sent just before the kill, its answer read after
    pause_s: float = 0.0

    def __str__(self) -> str:
        if self.kind == "submit":
            return f"submit {self.mode} {self.gpus} GPUs {self.team} hold {self.hold_s:.1f}s"
        if self.kind in ("cancel", "repeat"):
            return f"{self.kind} #{self.target:.2f}"
        if self.kind == "kill":
            return "kill" + (" with a submit in flight" if self.in_flight else "")
        return self.kind


def plan(seed: int) -> list[Step]:
    """10-14 steps: at least two submits first; a repeat only after a kill; a node removed only
    after it was added, and always by the end."""
    rng = random.Random(seed)
    steps: list[Step] = []
    node_added = killed = False
    for i in range(rng.randint(10, 14)):
        kinds = ["submit"] * 4 + (["cancel", "kill", "add_node" if not node_added else "remove_node"] if i >= 2 else [])
        if killed:
            kinds += ["repeat"] * 2
        kind = rng.choice(kinds)
        pause = round(rng.uniform(0.2, 1.2), 2)
        if kind == "submit":
            mode = rng.choices(["finish", "crash", "lost"], [6, 1, 1])[0]
            steps.append(
                Step(kind, mode, rng.randint(1, 8), rng.choice(TEAMS), round(rng.uniform(0, 3), 1), pause_s=pause)
            )
        elif kind == "kill":
            killed = True
            steps.append(Step(kind, in_flight=rng.random() < 0.5, pause_s=pause))
        else:
            node_added = node_added != (kind in ("add_node", "remove_node"))
            steps.append(Step(kind, target=rng.random(), pause_s=pause))
    if node_added:
        steps.append(Step("remove_node"))
    return steps


@dataclass
class Call:
    """A mutation the test made and had answered, to repeat with the same request id."""

    method: str
    args: tuple[Any, ...]
    answer: Any


@dataclass
class FaultRun:
    seed: int
    handle: Any
    cluster: Any
    marks: Path
    job_script: Path
    jobs: JobSubmissionClient
    client: SchedulerClient = field(init=False)
    modes: dict[str, str] = field(default_factory=dict)  # workload id -> job mode
    cancelled: set[str] = field(default_factory=set)
    calls: list[Call] = field(default_factory=list)
    calls_before_kill: int = 0
    extra_node: Any = None
    dead_since: dict[str, float] = field(default_factory=dict)  # node id -> first seen dead
    capacity: dict[str, int] = field(default_factory=dict)  # node id -> its GPUs
    log: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.client = SchedulerClient.of_handle(self.handle)

    # ------------------------------------------------------------------ steps
    def call(self, method: str, *args: Any) -> Any:
        """A mutation with the caller's request id (the last argument), retried while the actor
        restarts, as the typed client does."""
        deadline = time.monotonic() + 60
        while True:
            try:
                return ray.get(getattr(self.handle, method).remote(*args), timeout=60)
            except RayActorError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def submission(self, step: Step) -> WorkloadSubmission:
        entry = f"{sys.executable} {self.job_script} {step.mode} {step.hold_s} {self.marks}"
        return training_submission(f"fault-{step.mode}", step.gpus, step.team, entrypoint=entry)

    def run(self, step: Step) -> None:
        self.log.append(f"{time.strftime('%H:%M:%S')} {step}")
        getattr(self, f"do_{step.kind}")(step)

    def do_submit(self, step: Step) -> None:
        sub = self.submission(step)
        self.modes[sub.workload_id] = step.mode
        args = (sub, uuid.uuid4().hex)
        self.calls.append(Call("submit", args, self.call("submit", *args)))
        self.log.append(f"  -> {sub.workload_id}")

    def do_cancel(self, step: Step) -> None:
        rows = {r["workload_id"]: r["state"] for r in self.client.list_workloads()}
        open_ = sorted(w for w in self.modes if rows.get(w) != "done" and w not in self.cancelled)
        if not open_:
            self.log.append("  -> nothing to cancel")
            return
        workload = open_[int(step.target * len(open_))]
        args = (workload, uuid.uuid4().hex)
        try:
            answer = self.call("cancel", *args)
        except RayTaskError as exc:  # it ended between the listing and the cancel: refused
            self.log.append(f"  -> {workload} refused: {type(exc.cause).__name__}")
            return
        self.cancelled.add(workload)
        self.calls.append(Call("cancel", args, answer))
        self.log.append(f"  -> {workload}")

    def do_kill(self, step: Step) -> None:
        incarnation, pid = self.client.ping(), self.client.pid()
        in_flight = None
        if step.in_flight:
            sub = self.submission(Step("submit", "finish", 1, TEAMS[0], 0.5))
            self.modes[sub.workload_id] = "finish"
            args = (sub, uuid.uuid4().hex)
            in_flight = (args, self.handle.submit.remote(*args))
        os.kill(pid, signal.SIGKILL)
        killed_at = time.monotonic()
        wait_for(lambda: self.client.ping() != incarnation, timeout=30, every=0.1)
        self.log.append(f"  -> restarted in {time.monotonic() - killed_at:.1f}s")
        self.calls_before_kill = len(self.calls)
        if in_flight is not None:
            args, ref = in_flight
            try:
                answer = ray.get(ref, timeout=60)  # answered before the kill, or replayed by Ray after
            except RayActorError:  # Ray gave up on it: the typed client would send it again
                answer = self.call("submit", *args)
            self.calls.append(Call("submit", args, answer))
            self.log.append(f"  -> in flight {args[0].workload_id}: {answer}")

    def do_repeat(self, step: Step) -> None:
        released = sorted(p.name.removeprefix("answer-") for p in self.marks.glob("answer-*"))
        choices = [("call", i) for i in range(self.calls_before_kill)] + [("release", i) for i in range(len(released))]
        if not choices:
            return
        what, i = choices[int(step.target * len(choices))]
        if what == "release":
            lease = released[i]
            first = (self.marks / f"answer-{lease}").read_text() == "True"
            again = self.client.release(lease, True)
            self.log.append(f"  -> release {lease}: {again} (first {first})")
            if again != first:
                self.violations.append(f"a repeated release of {lease} answered {again}, first {first}")
            return
        made = self.calls[i]
        again = self.call(made.method, *made.args)
        self.log.append(f"  -> {made.method} {made.args[0] if made.method == 'cancel' else made.args[0].workload_id}")
        if again != made.answer:
            self.violations.append(f"a repeated {made.method} answered {again!r}, first {made.answer!r}")

    def do_add_node(self, step: Step) -> None:
        self.extra_node = self.cluster.add_node(
            num_cpus=2, num_gpus=8, resources=node_resources(8), labels={"switchyard/node-group": "c"}
        )
        self.cluster.wait_for_nodes()
        self.log.append(f"  -> {self.extra_node.node_id[:12]}")

    def do_remove_node(self, step: Step) -> None:
        if self.extra_node is not None:
            self.cluster.remove_node(self.extra_node)
            self.extra_node = None

    # ------------------------------------------------------------------ invariants
    def check_invariants(self) -> None:
        """Record every violation seen now (the test fails at the end with all of them)."""
        now = time.time()
        before = {r["workload_id"]: r for r in self.client.list_workloads()}
        status = self.client.status()
        events = self.client.events()
        after = {r["workload_id"]: r for r in self.client.list_workloads()}
        self.check_gpus(status, now)
        self.check_claims(status, now)
        self.check_outcomes(before, events, after)

    def check_gpus(self, status: dict[str, Any], now: float) -> None:
        alive: set[str] = set()
        for n in ray.nodes():
            gpus = int(n.get("Resources", {}).get("GPU", 0))
            if n.get("Alive"):
                alive.add(n["NodeID"])
                self.capacity[n["NodeID"]] = gpus  # a dead node reports no resources: kept from when alive
            else:
                self.dead_since.setdefault(n["NodeID"], now)
        booked: dict[str, int] = {}
        ids = [lease["lease_id"] for lease in status["leases"]]
        if len(ids) != len(set(ids)):
            self.violations.append(f"a lease listed twice: {sorted(ids)}")
        for lease in status["leases"]:
            [node] = set(lease["nodes"])  # every gang here is one bundle
            booked[node] = booked.get(node, 0) + lease["gpus"]
            if node not in alive and now - self.dead_since.get(node, now) > SLACK_S + 2.0:  # the 2 s node refresh
                self.violations.append(
                    f"lease {lease['lease_id']} on node {node[:12]}, dead since {self.dead_since[node]:.1f}"
                )
        for node, gpus in booked.items():
            if gpus > self.capacity.get(node, 0):
                self.violations.append(f"node {node[:12]}: {gpus} GPUs leased of {self.capacity.get(node)}")
        if status["free_gpus"] != status["total_gpus"] - sum(booked.values()) or status["free_gpus"] < 0:
            self.violations.append(f"free GPUs {status['free_gpus']} of {status['total_gpus']}, leased {booked}")

    def check_claims(self, status: dict[str, Any], now: float) -> None:
        for lease in status["leases"]:
            age = now - lease["started_at"]
            if age > CLAIM_TIMEOUT_S + SLACK_S and not (self.marks / f"claimed-{lease['lease_id']}").exists():
                self.violations.append(f"lease {lease['lease_id']} unclaimed after {age:.1f}s")

    def check_outcomes(self, before: dict[str, Any], events: list[dict[str, Any]], after: dict[str, Any]) -> None:
        by_workload: dict[str, list[dict[str, Any]]] = {}
        for e in events:
            by_workload.setdefault(e["workload_id"], []).append(e)
        for workload in self.modes:
            if workload not in after:
                continue  # not yet answered (the in-flight submit of a kill)
            kinds = [e["kind"] for e in by_workload.get(workload, [])]
            if after[workload]["state"] not in ("queued", "running", "preempting", "done"):
                self.violations.append(f"{workload}: state {after[workload]['state']}")
            if kinds.count("submitted") != 1 or kinds.count("cancelled") > 1:
                self.violations.append(f"{workload}: a call done twice: {kinds}")
            ending = self.unexplained_end(workload, by_workload.get(workload, []))
            if ending:
                self.violations.append(f"{workload} ({self.modes[workload]}): {ending}: {kinds}")
            if (
                workload in before
                and before[workload]["state"] == "done"
                and not {"released", "cancelled", "ended"} & set(kinds)
            ):
                self.violations.append(f"{workload}: done with no ending in its events: {kinds}")
            if {"released", "ended"} & set(kinds) and after[workload]["state"] != "done":
                self.violations.append(f"{workload}: {after[workload]['state']} after it ended: {kinds}")

    def unexplained_end(self, workload: str, events: list[dict[str, Any]]) -> str | None:
        """Why an ending in the events is not one of the three allowed, or None."""
        for i, e in enumerate(events):
            earlier = [x["kind"] for x in events[:i]]
            if e["kind"] == "released":
                lease = e.get("lease_id", "")
                exited = i > 0 and events[i - 1]["kind"] == "job_exited" and events[i - 1].get("lease_id") == lease
                if not (self.marks / f"released-{lease}").exists() and "cancelled" not in earlier and not exited:
                    return f"released lease {lease} its job never released"
            elif e["kind"] == "cancelled" and workload not in self.cancelled:
                return "cancelled, not by the test"
            elif e["kind"] == "ended" and earlier.count("claim_timeout") < MAX_TIMEOUTS:
                return f"ended after {earlier.count('claim_timeout')} claim timeouts"
        return None

    def check_holds(self) -> None:
        """Ray's state API: every grant hold that formed belongs to a live lease (a hold outliving
        its lease would keep Serve off free GPUs; two for one lease would double its GPUs)."""
        from ray.util.state import list_placement_groups

        prefix = f"{HOLD_NAME_PREFIX}{SCHEDULER_ACTOR}:"

        def stray() -> list[str]:
            leases = {lease["lease_id"] for lease in self.client.status()["leases"]}
            groups = list_placement_groups(filters=[("state", "=", "CREATED")], limit=1000)
            held = [g.name.removeprefix(prefix) for g in groups if g.name.startswith(prefix)]
            if len(held) != len(set(held)):
                return [f"two holds for one lease: {sorted(held)}"]
            return [f"hold of ended lease {h}" for h in held if h not in leases]

        try:
            wait_for(lambda: not stray(), timeout=10, every=0.5)
        except AssertionError:
            self.violations.extend(stray())

    def check_for(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while True:
            self.check_invariants()
            if time.monotonic() >= deadline:
                return
            time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))

    def settled(self) -> bool:
        """Nothing left to happen by itself: every job has released its lease (or the scheduler
        released it when the job ended), and every grant nobody claims has run out its claim
        timeouts."""
        return not self.client.status()["leases"]

    def dead_jobs_holding_leases(self) -> list[str]:
        """Claimed leases whose launched Ray job has ended without releasing."""
        rows = {r["workload_id"]: r for r in self.client.list_workloads()}
        held = []
        for workload, row in rows.items():
            running = row["state"] in ("running", "preempting") and row["ray_job"]
            if running and self.jobs.get_job_status(row["ray_job"]) in (JobStatus.FAILED, JobStatus.SUCCEEDED):
                held.append(f"{workload} ({self.modes.get(workload)}, job {row['ray_job']})")
        return held

    def clean_up(self) -> None:
        for row in self.client.list_workloads():
            if row["state"] != "done":
                with contextlib.suppress(RayTaskError):  # ended meanwhile
                    self.client.cancel(row["workload_id"])
        for job in self.jobs.list_jobs():
            wid = (job.metadata or {}).get("switchyard_workload")
            if wid in self.modes and job.status in (JobStatus.PENDING, JobStatus.RUNNING):
                self.jobs.stop_job(job.submission_id)
        if self.extra_node is not None:
            self.cluster.remove_node(self.extra_node)
            self.extra_node = None

    def outcomes(self) -> None:
        """Each workload's job, state and events, for the report."""
        rows = {r["workload_id"]: r["state"] for r in self.client.list_workloads()}
        for workload, mode in self.modes.items():
            kinds = [e["kind"] for e in self.client.events(workload)]
            self.log.append(f"{workload} {mode}: {rows.get(workload)} {kinds}")

    def report(self) -> str:
        steps = "\n".join(self.log)
        return f"seed {self.seed} ({SEEDS_ENV}={self.seed} reruns it)\nsteps:\n{steps}"


@pytest.fixture
def fault_run(
    platform_scheduler_with: Callable[..., Any], ray_cluster: dict[str, Any], tmp_path: Path, request: Any
) -> Iterator[FaultRun]:
    handle = platform_scheduler_with(POLICY, restartable=True, claim_timeout_s=CLAIM_TIMEOUT_S)
    marks = tmp_path / "marks"
    marks.mkdir()
    script = tmp_path / "fault_job.py"
    script.write_text(JOB)
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    run = FaultRun(request.param, handle, ray_cluster["cluster"], marks, script, jobs)
    try:
        yield run
    finally:
        run.clean_up()


@pytest.mark.parametrize("fault_run", SEEDS, indirect=True, ids=lambda s: f"seed{s}")
def test_faults_leave_no_gpu_double_booked_and_no_workload_lost(fault_run: FaultRun) -> None:
    run = fault_run
    steps = plan(run.seed)
    for step in steps:
        run.run(step)
        run.check_for(step.pause_s)
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_S and not run.settled():
        run.check_for(1.0)
    run.log.append(f"settled: {run.settled()} after {time.monotonic() - started:.1f}s")
    run.check_holds()
    leaked = run.dead_jobs_holding_leases()
    run.log.append(f"leases of ended jobs: {leaked}")
    run.violations += [f"lease of an ended job: {w}" for w in leaked]
    run.outcomes()
    if run.violations:
        unique = list(dict.fromkeys(run.violations))
        pytest.fail(f"{len(unique)} violations:\n" + "\n".join(unique[:20]) + "\n" + run.report(), pytrace=False)
    print(run.report())
