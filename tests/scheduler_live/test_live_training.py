"""A real Ray Train job through the live scheduler: launched on admission through the Jobs API,
workers pinned to the granted GPUs, preempted for production inference, checkpointed, requeued
and resumed from its checkpoint. The scheduler drives every step; the test only submits."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray.job_submission import JobStatus, JobSubmissionClient
from ray.util.state import list_actors

from switchyard.cluster.admission import training_submission
from tests.scheduler_live.conftest import borrowing_policy, job_logs, wait_for, whole_node_inference

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = borrowing_policy(grace_s=120)


@pytest.fixture
def platform_scheduler(ray_cluster: dict[str, Any], tmp_path: Path) -> Iterator[Any]:
    """The scheduler under its platform name: jobs find it by that name."""
    from switchyard.cluster.grant_holds import remove_holds
    from switchyard.cluster.record import NAMESPACE, SCHEDULER_ACTOR
    from switchyard.cluster.scheduler_actor import SchedulerActor

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "scheduler.yaml").write_text(POLICY)
    actor = SchedulerActor.options(  # type: ignore[attr-defined]
        name=SCHEDULER_ACTOR, namespace=NAMESPACE, num_cpus=0
    ).remote(str(tmp_path / "policies"), str(tmp_path / "state"), ray_cluster["dashboard_url"])
    wait_for(lambda: ray.get(actor.status.remote())["total_gpus"] == 16)
    yield actor
    ray.kill(actor, no_restart=True)
    remove_holds(SCHEDULER_ACTOR)


def job_spec(tmp_path: Path, steps: int = 40) -> Path:
    spec = {
        "name": "sched-e2e",
        "steps": steps,
        "seed": 0,
        "num_workers": 2,
        "model": {"preset": "tiny"},
        "data": {"source": "synthetic", "seq_len": 32, "micro_batch_size": 2},
        "parallel": {"strategy": "fsdp-full"},
        "optim": {"lr": 3.0e-3, "warmup_steps": 2},
        "checkpoint": {"every_steps": 2, "keep": 2, "save_final": True, "uri": str(tmp_path / "ckpt")},
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def wait_job_end(jobs: JobSubmissionClient, submission_id: str, timeout: float) -> str:
    """The job's logs once it has ended; its logs in the failure message if it does not."""
    try:
        wait_for(
            lambda: jobs.get_job_status(submission_id) in (JobStatus.FAILED, JobStatus.SUCCEEDED, JobStatus.STOPPED),
            timeout=timeout,
        )
    except AssertionError:
        raise AssertionError(
            f"job {submission_id} still {jobs.get_job_status(submission_id)} after {timeout}s:\n"
            f"{jobs.get_job_logs(submission_id)[-4000:]}"
        ) from None
    logs: str = jobs.get_job_logs(submission_id)
    return logs


def last_json_line(logs: str) -> dict[str, Any]:
    lines = [line for line in logs.splitlines() if line.startswith("{") and '"status"' in line]
    assert lines, f"no result line in the job's logs:\n{logs[-3000:]}"
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def test_train_job_is_placed_preempted_requeued_and_resumed(
    platform_scheduler: Any, ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    scheduler = platform_scheduler
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    config = job_spec(tmp_path)
    entry = f"{sys.executable} -m train_jobs.run {config} --team research"
    train = training_submission("sched-e2e", 2, "research", entrypoint=entry)
    ray.get(scheduler.submit.remote(train))

    # 1. Admitted and launched as a Ray job; its workers run on exactly the granted node.
    grant = wait_for(lambda: ray.get(scheduler.lease.remote(train.workload_id)), timeout=30)
    granted_node = grant.placements[0].node_id
    first_job = f"{train.workload_id}-1"
    try:
        wait_for(lambda: any((tmp_path / "ckpt" / "research" / "sched-e2e").glob("step-*/manifest.json")), timeout=180)
    except AssertionError:
        # The job may never have been submitted (CI: a 404 here hid why): the scheduler's
        # events and Ray's job list say how far the launch got.
        submitted = {j.submission_id: j.status for j in jobs.list_jobs()}
        raise AssertionError(
            f"no checkpoint; jobs {submitted}; events {ray.get(scheduler.events.remote(train.workload_id))}\n"
            f"{job_logs(jobs, first_job)[-4000:]}"
        ) from None
    workers = wait_for(
        lambda: [
            a
            for a in list_actors(filters=[("class_name", "=", "RayTrainWorker")], detail=True)
            if a.state == "ALIVE" and a.job_id == jobs.get_job_info(first_job).job_id
        ]
    )
    assert {w.node_id for w in workers} == {granted_node}

    # 2. Production inference needs whole nodes: one is free, the second forces a preemption.
    prod = whole_node_inference(2)
    for sub in prod:
        ray.get(scheduler.submit.remote(sub))
    assert wait_for(lambda: ray.get(scheduler.preemption_notice.remote(train.workload_id)), timeout=30)

    # 3. The job checkpoints and exits "preempted, resumable"; it is requeued; inference gets its GPUs.
    preempted = last_json_line(wait_job_end(jobs, first_job, timeout=120))
    assert preempted["status"] == "preempted" and preempted["resumable"] is True
    prod_leases = [wait_for(lambda s=s: ray.get(scheduler.lease.remote(s.workload_id)), timeout=30) for s in prod]
    assert ray.get(scheduler.lease.remote(train.workload_id)) is None

    # 4. Inference scales down; training is admitted again and resumes from its checkpoint.
    ray.get(scheduler.release.remote(prod_leases[1].lease_id, True))
    second_job = f"{train.workload_id}-2"
    wait_for(lambda: second_job in {j.submission_id for j in jobs.list_jobs()}, timeout=30)
    done = last_json_line(wait_job_end(jobs, second_job, timeout=240))
    assert done["status"] == "completed" and done["step"] == 40
    # It resumed from the checkpoint the preempted run wrote on its way out, not from scratch.
    assert preempted["step"] > 0 and done["resumed_from"] == preempted["checkpoint"]

    events = ray.get(scheduler.events.remote(train.workload_id))
    # The job released its GPUs itself after its checkpoint: no stop order was needed.
    kinds = [e["kind"] for e in events if e["kind"] != "resumed"]
    assert kinds == ["submitted", "admitted", "preemption_notice", "requeued", "admitted", "released"]
    assert [e["step"] for e in events if e["kind"] == "resumed"] == [preempted["step"]]
    ray.get(scheduler.release.remote(prod_leases[0].lease_id, True))
