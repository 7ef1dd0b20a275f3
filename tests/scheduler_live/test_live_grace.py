"""A job that ignores its preemption notice is stopped at the end of the grace period, and its
GPUs go to the preemptor: a job the scheduler launched is stopped through the Jobs API,
requeued and launched again; a job submitted by hand that claimed its lease is stopped too,
and since nothing would come back for its workload, the workload ends with it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.job_submission import JobStatus, JobSubmissionClient

from switchyard.cluster.admission import RAY_NODE_ID_KEY, training_submission
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy, WorkloadClass
from tests.scheduler_live.conftest import borrowing_policy, job_logs, wait_for
from tests.scheduler_live.test_live_training import wait_job_end

pytestmark = pytest.mark.ray  # each test ~10-15 s: two short Ray jobs

POLICY = borrowing_policy(grace_s=2)

# Takes its lease (the one it was launched for, or a new one), holds the granted GPUs with an
# actor pinned to the granted node, and never looks at a preemption notice. Launched a second
# time, it gives the lease back at once.
DEAF_JOB = textwrap.dedent("""
    import os, sys, time
    import ray
    from switchyard.cluster.admission import RAY_NODE_ID_KEY, admit, launched_workload, training_submission

    ray.init()
    launched = launched_workload() is not None
    admission = admit(None if launched else training_submission("deaf-direct", 8, "research"))
    [placement] = admission.grant.placements

    @ray.remote(num_cpus=0)
    class Holder:
        def ready(self):
            return True

    holder = Holder.options(num_gpus=placement.gpus, label_selector={RAY_NODE_ID_KEY: placement.node_id}).remote()
    ray.get(holder.ready.remote())
    print("holding", admission.grant.lease_id, flush=True)
    if admission.grant.lease_id.endswith("#1"):
        time.sleep(3600)  # deaf to every notice
    admission.release(finished=True)
""")


def inference(gpus: int = 8) -> WorkloadSubmission:
    return WorkloadSubmission(
        team="prod",
        bundles=(gpus,),
        workload_class=WorkloadClass.INFERENCE,
        priority_class="production-inference",
        strategy=PlacementStrategy.STRICT_PACK,
    )


def kinds(scheduler: Any, workload_id: str) -> list[str]:
    return [e["kind"] for e in ray.get(scheduler.events.remote(workload_id))]


def preemptor_runs_on(node_id: str, gpus: int) -> None:
    """What the preemptor would do with its grant: hold the GPUs on that node. It only starts
    if the victim's GPUs really are free in Ray."""

    @ray.remote(num_cpus=0)
    class Replica:
        def ready(self) -> bool:
            return True

    replica = Replica.options(num_gpus=gpus, label_selector={RAY_NODE_ID_KEY: node_id}).remote()  # type: ignore[attr-defined]
    try:
        assert ray.get(replica.ready.remote(), timeout=60)
    finally:
        ray.kill(replica)


def test_launched_job_ignoring_its_notice_is_stopped_requeued_and_relaunched(
    platform_scheduler_with: Callable[..., Any], ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    scheduler = platform_scheduler_with(POLICY)
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    script = tmp_path / "deaf.py"
    script.write_text(DEAF_JOB)
    first_prod = inference()
    ray.get(scheduler.submit.remote(first_prod))
    first_prod_lease = wait_for(lambda: ray.get(scheduler.lease.remote(first_prod.workload_id)))
    deaf = training_submission("deaf", 8, "research", entrypoint=f"{sys.executable} {script}")
    ray.get(scheduler.submit.remote(deaf))
    grant = wait_for(lambda: ray.get(scheduler.lease.remote(deaf.workload_id)))
    first_job = f"{deaf.workload_id}-1"
    wait_for(lambda: "holding" in job_logs(jobs, first_job), timeout=120)

    # Inference wants the other node back; the job never answers the notice.
    second_prod = inference()
    ray.get(scheduler.submit.remote(second_prod))
    wait_for(lambda: ray.get(scheduler.preemption_notice.remote(deaf.workload_id)))
    prod_lease = wait_for(lambda: ray.get(scheduler.lease.remote(second_prod.workload_id)), timeout=30)
    assert prod_lease.placements[0].node_id == grant.placements[0].node_id
    wait_job_end(jobs, first_job, timeout=60)
    assert jobs.get_job_status(first_job) == JobStatus.STOPPED
    events = ray.get(scheduler.events.remote(deaf.workload_id))
    assert [e["kind"] for e in events] == [
        "submitted", "admitted", "preemption_notice", "stop_order", "requeued", "job_stopped"
    ]
    assert events[3]["reason"] == "grace period over" and events[5]["ray_job"] == first_job
    # Stopping the job freed its GPUs in Ray: the preemptor can hold them.
    preemptor_runs_on(prod_lease.placements[0].node_id, 8)

    # Requeued, not dropped: when GPUs free up it is launched again (and this time finishes).
    ray.get(scheduler.release.remote(first_prod_lease.lease_id, True))
    second_job = f"{deaf.workload_id}-2"
    wait_for(lambda: second_job in {j.submission_id for j in jobs.list_jobs()}, timeout=30)
    logs = wait_job_end(jobs, second_job, timeout=120)
    assert jobs.get_job_status(second_job) == JobStatus.SUCCEEDED, logs[-3000:]
    assert kinds(scheduler, deaf.workload_id)[6:] == ["admitted", "released"]
    ray.get(scheduler.release.remote(prod_lease.lease_id, True))


def test_job_submitted_by_hand_ignoring_its_notice_is_stopped(
    platform_scheduler_with: Callable[..., Any], ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    scheduler = platform_scheduler_with(POLICY)
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    script = tmp_path / "deaf.py"
    script.write_text(DEAF_JOB)
    first_prod = inference()
    ray.get(scheduler.submit.remote(first_prod))
    wait_for(lambda: ray.get(scheduler.lease.remote(first_prod.workload_id)))
    job = jobs.submit_job(entrypoint=f"{sys.executable} {script}")  # not through the scheduler
    wait_for(lambda: "holding" in job_logs(jobs, job), timeout=120)
    [workload] = [w for w in ray.get(scheduler.list_workloads.remote()) if w["description"] == "deaf-direct"]
    wid = workload["workload_id"]
    grant = ray.get(scheduler.lease.remote(wid))

    second_prod = inference()
    ray.get(scheduler.submit.remote(second_prod))
    wait_for(lambda: ray.get(scheduler.preemption_notice.remote(wid)))
    prod_lease = wait_for(lambda: ray.get(scheduler.lease.remote(second_prod.workload_id)), timeout=30)
    assert prod_lease.placements[0].node_id == grant.placements[0].node_id
    wait_job_end(jobs, job, timeout=60)
    assert jobs.get_job_status(job) == JobStatus.STOPPED  # found through the Ray job that claimed the lease
    events = ray.get(scheduler.events.remote(wid))
    assert [e["kind"] for e in events] == [
        "submitted", "admitted", "preemption_notice", "stop_order", "released", "job_stopped"
    ]
    assert events[3]["reason"] == "grace period over" and events[5]["ray_job"] == job
    # Its job is gone and the scheduler cannot launch it again: the workload is over, not queued.
    assert wid not in ray.get(scheduler.status.remote())["pending"]
    preemptor_runs_on(prod_lease.placements[0].node_id, 8)
