"""How a job on the cluster gets its GPUs: through the scheduler, whoever started it.

A job the scheduler launched finds its workload id in `SWITCHYARD_WORKLOAD_ID` and claims the
lease already granted to it. A job a researcher started directly (`ray job submit -- python
-m train_jobs.run CONFIG`) submits itself and waits in the same queue. Either way the job
then pins its workers to the granted nodes with per-worker label selectors on Ray's node-id
label, so Ray Train's own placement group can only form on the GPUs the scheduler chose.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass

import ray

from switchyard.cluster.job_launcher import LEASE_ENV, WORKLOAD_ENV
from switchyard.cluster.record import NAMESPACE, SCHEDULER_ACTOR
from switchyard.cluster.scheduler_client import SchedulerClient, platform_scheduler
from switchyard.scheduler.api import LeaseGrant, WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy, WorkloadClass

log = logging.getLogger(__name__)

RAY_NODE_ID_KEY = "ray.io/node-id"  # the label Ray puts on every node (ray._raylet.RAY_NODE_ID_KEY)


class NoScheduler(Exception):
    """The cluster runs no switchyard scheduler (plain Ray): there is nothing to be admitted by."""


@dataclass(frozen=True)
class Admission:
    grant: LeaseGrant
    scheduler: SchedulerClient  # to release the lease and report checkpoints

    @property
    def workload_id(self) -> str:
        return self.grant.workload_id

    def worker_label_selectors(self, gpus_per_worker: int = 1) -> list[dict[str, str]]:
        """One selector per worker (each holding `gpus_per_worker` granted GPUs), in bundle order."""
        return [{RAY_NODE_ID_KEY: p.node_id} for p in self.grant.placements for _ in range(p.gpus // gpus_per_worker)]

    def release(self, finished: bool) -> bool:
        """Give the GPUs back. True when the workload was requeued (it was preempted and has not
        finished): `admit(None, workload_id=...)` then waits for its next grant."""
        return self.scheduler.release(self.grant.lease_id, finished)

    def report_checkpoint(self) -> None:
        self.scheduler.report_checkpoint(self.workload_id, wait=False)  # fire and forget: advisory

    def preempted(self) -> bool:
        return self.scheduler.preemption_notice(self.workload_id) is not None


def scheduler_client() -> SchedulerClient:
    try:
        return platform_scheduler()
    except ValueError:
        raise NoScheduler(f"no {SCHEDULER_ACTOR!r} actor in namespace {NAMESPACE!r}") from None


def launched_workload() -> str | None:
    """The workload this job was launched for by the scheduler, if it was."""
    return os.environ.get(WORKLOAD_ENV)


def launched_lease() -> str | None:
    """The lease this job was launched for by the scheduler, if it was."""
    return os.environ.get(LEASE_ENV)


def submit(submission: WorkloadSubmission) -> str:
    """Queue a workload with the scheduler without waiting; `admit(None, workload_id=...)` waits."""
    return scheduler_client().submit(submission)


def admit(
    submission: WorkloadSubmission | None,
    poll_s: float = 1.0,
    timeout_s: float | None = None,
    *,
    workload_id: str | None = None,
) -> Admission:
    """Block until the scheduler grants this job its GPUs; claim the lease for this Ray job.

    The workload is `workload_id` when given (one already submitted, or requeued after a
    preemption), else the one the scheduler launched this job for, else `submission`, queued now."""
    scheduler = scheduler_client()
    ray_job = ray.get_runtime_context().get_job_id()
    # A launched job names its lease: one that started after that grant was taken back is
    # refused rather than run beside the workload's next attempt.
    lease_id = launched_lease() if workload_id is None and launched_workload() is not None else None
    workload_id = workload_id or launched_workload()
    if workload_id is None:
        if submission is None:
            raise ValueError("a job started outside the scheduler must describe what it asks for")
        workload_id = scheduler.submit(submission)
        log.info("submitted as workload %s; waiting for admission", workload_id)
    started = time.monotonic()
    while True:
        grant = scheduler.claim(workload_id, ray_job, lease_id)
        if grant is not None:
            log.info(
                "admitted after %.1fs: lease %s on %s",
                time.monotonic() - started,
                grant.lease_id,
                [(p.node_id[:8], p.gpus) for p in grant.placements],
            )
            return Admission(grant, scheduler)
        if timeout_s is not None and time.monotonic() - started > timeout_s:
            scheduler.cancel(workload_id)
            raise TimeoutError(f"workload {workload_id} was not admitted within {timeout_s:.0f}s")
        time.sleep(poll_s)


def gang_bundles(gpus: int, gpus_per_node: int = 8, gpus_per_worker: int = 1) -> tuple[int, ...]:
    """One bundle per node: whole nodes, then the remainder (a 12-GPU job is (8, 4)). A node
    holds whole workers only (12 GPUs as 4 workers x 3: (6, 6))."""
    if gpus % gpus_per_worker:
        raise ValueError(f"{gpus} GPUs are not whole workers of {gpus_per_worker} GPUs")
    per_node = gpus_per_node // gpus_per_worker * gpus_per_worker
    if per_node == 0:
        raise ValueError(f"a worker of {gpus_per_worker} GPUs does not fit a node of {gpus_per_node}")
    full, rest = divmod(gpus, per_node)
    return (per_node,) * full + ((rest,) if rest else ())


def training_submission(
    name: str,
    gpus: int,
    team: str,
    priority_class: str = "training",
    workload_class: WorkloadClass = WorkloadClass.TRAINING,
    checkpoint_interval_s: float | None = None,
    entrypoint: str | None = None,
    workload_id: str | None = None,
    gpus_per_worker: int = 1,
) -> WorkloadSubmission:
    """The gang a training job asks for: its workers' GPUs, packed on as few nodes as possible,
    all in one node group (NCCL rings across node groups are what topology-aware placement avoids)."""
    bundles = gang_bundles(gpus, gpus_per_worker=gpus_per_worker)
    return WorkloadSubmission(
        **({"workload_id": workload_id} if workload_id else {}),
        team=team,
        workload_class=workload_class,
        priority_class=priority_class,
        bundles=bundles,
        strategy=PlacementStrategy.STRICT_PACK if len(bundles) == 1 else PlacementStrategy.PACK,
        same_node_group=True,
        checkpoint_interval_s=checkpoint_interval_s,
        description=name,
        entrypoint=entrypoint,
    )
