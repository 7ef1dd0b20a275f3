"""Admission for jobs the scheduler did not launch: a researcher's own `ray job submit`, and a
rogue TorchTrainer run that skips admission altogether."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.job_submission import JobStatus, JobSubmissionClient
from ray.util.state import list_actors

from tests.scheduler_live.conftest import wait_for, whole_node_inference
from tests.scheduler_live.test_live_training import job_spec, last_json_line, platform_scheduler, wait_job_end

pytestmark = [pytest.mark.ray, pytest.mark.slow]
__all__ = ["platform_scheduler"]  # the fixture, shared with the end-to-end training test


def test_direct_ray_job_submit_waits_for_admission(
    platform_scheduler: Any, ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    config = job_spec(tmp_path, steps=6)
    job = jobs.submit_job(entrypoint=f"{sys.executable} -m train_jobs.run {config} --team research")
    result = last_json_line(wait_job_end(jobs, job, timeout=240))
    assert result["status"] == "completed" and result["step"] == 6
    [workload] = [w for w in ray.get(platform_scheduler.list_workloads.remote()) if w["description"] == "sched-e2e"]
    events = ray.get(platform_scheduler.events.remote(workload["workload_id"]))
    assert [e["kind"] for e in events] == ["submitted", "admitted", "released"]
    granted_nodes = set(events[1]["nodes"])
    ray_job = jobs.get_job_info(job).job_id
    workers = list_actors(filters=[("class_name", "=", "RayTrainWorker"), ("job_id", "=", ray_job)], detail=True)
    assert workers and {w.node_id for w in workers} <= granted_nodes


def test_rogue_torchtrainer_is_detected_and_stopped(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    from switchyard.cluster.scheduler_actor import SchedulerActor

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "scheduler.yaml").write_text("version: 1\nteams: []\n")
    actor = SchedulerActor.options(name="rogue-watch", namespace="switchyard", num_cpus=0).remote(  # type: ignore[attr-defined]
        str(tmp_path / "policies"), str(tmp_path / "state"), ray_cluster["dashboard_url"], True
    )
    script = tmp_path / "rogue.py"
    script.write_text(
        textwrap.dedent("""
        import time, ray
        from ray.train import ScalingConfig
        from ray.train.torch import TorchConfig, TorchTrainer

        def loop(config):
            time.sleep(600)  # holds its GPUs, never asked the scheduler for them

        ray.init()
        TorchTrainer(loop, torch_config=TorchConfig(backend="gloo"),
                     scaling_config=ScalingConfig(num_workers=2, use_gpu=True)).fit()
    """)
    )
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    job = jobs.submit_job(entrypoint=f"{sys.executable} {script}")
    try:
        ray_job = wait_for(lambda: jobs.get_job_info(job).job_id, timeout=60)
        report = wait_for(
            lambda: (o := ray.get(actor.status.remote())["outside_leases"]) and o["unleased"] and o, timeout=120
        )
        offender = next(u for u in report["unleased"] if u["job_id"] == ray_job)
        assert offender["gpus"] == 2 and offender["placement_groups"]
        # Enforcement is on: its placement group is removed at once (the GPUs are free again) and,
        # since Ray Train would retry with a new one forever, the submitted job is stopped.
        logs = wait_job_end(jobs, job, timeout=180)
        assert jobs.get_job_status(job).value == "STOPPED", logs[-2000:]
    finally:
        jobs.stop_job(job)
        ray.kill(actor, no_restart=True)


def test_direct_job_preempted_waits_in_the_queue_and_resumes(
    platform_scheduler: Any, ray_cluster: dict[str, Any], tmp_path: Path
) -> None:
    """Nothing would launch a job submitted by hand again, so after a preemption its driver
    waits in the queue itself, holding no GPUs, and resumes from its checkpoint."""
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
    job = jobs.submit_job(entrypoint=f"{sys.executable} -m train_jobs.run {job_spec(tmp_path)} --team research")
    wait_for(lambda: any((tmp_path / "ckpt" / "research" / "sched-e2e").glob("step-*/manifest.json")), timeout=180)
    [workload] = [w for w in ray.get(platform_scheduler.list_workloads.remote()) if w["description"] == "sched-e2e"]
    wid = workload["workload_id"]
    prod = whole_node_inference(2)
    for sub in prod:
        ray.get(platform_scheduler.submit.remote(sub))
    prod_leases = [
        wait_for(lambda s=s: ray.get(platform_scheduler.lease.remote(s.workload_id)), timeout=120) for s in prod
    ]
    assert wid in ray.get(platform_scheduler.status.remote())["pending"]  # requeued; its driver still runs
    assert jobs.get_job_status(job) == JobStatus.RUNNING
    ray.get(platform_scheduler.release.remote(prod_leases[1].lease_id, True))
    done = last_json_line(wait_job_end(jobs, job, timeout=240))
    assert done["status"] == "completed" and done["step"] == 40 and done["resumed_from"]
    kinds = [e["kind"] for e in ray.get(platform_scheduler.events.remote(wid)) if e["kind"] != "stop_order"]
    # The second run reported where it resumed (the event log's `resumed`, from rank 0).
    assert kinds == ["submitted", "admitted", "preemption_notice", "requeued", "admitted", "resumed", "released"]
    ray.get(platform_scheduler.release.remote(prod_leases[0].lease_id, True))
