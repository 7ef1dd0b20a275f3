"""Node loss: a real Train job whose lease is on a node that leaves the cluster is requeued,
admitted again on another node and resumes there from its last checkpoint. Checkpoints go to
`s3://` (moto's server on 127.0.0.1): the logical nodes of a test cluster share one disk,
which would hide a checkpoint that only lived on the lost node."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import ray
import yaml
from ray.job_submission import JobStatus, JobSubmissionClient

from switchyard.cluster.admission import training_submission
from switchyard.cluster.grant_holds import node_resources
from switchyard.ports import listener_port
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy
from tests.scheduler_live.conftest import wait_for
from tests.scheduler_live.test_live_training import last_json_line, wait_job_end

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = """
version: 1
priority_classes:
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
teams:
  - name: research
    quotas: [{classes: [training], guaranteed_gpus: 24}]
"""
BUCKET = "ckpt"
JOB = "sched-nodeloss"


@pytest.fixture
def s3_env() -> Iterator[dict[str, str]]:
    """A moto S3 server with bucket `ckpt`; the environment a job needs to reach it (dummy
    credentials, only for this server)."""
    from moto.server import ThreadedMotoServer

    port = listener_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    env = {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)  # for boto3 here
    try:
        import boto3

        boto3.client("s3").create_bucket(Bucket=BUCKET)
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.stop()


def checkpoints_in_s3() -> list[str]:
    """`s3://ckpt/research/<job>/step-N` of every complete checkpoint (its manifest is written
    last): an admitted job's run is under its team's."""
    import boto3

    pages = boto3.client("s3").get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=f"research/{JOB}/")
    keys = [obj["Key"] for page in pages for obj in page.get("Contents", [])]
    return sorted(f"s3://{BUCKET}/{k.rsplit('/', 1)[0]}" for k in keys if k.endswith("/manifest.json"))


def filler(group: str) -> WorkloadSubmission:
    return WorkloadSubmission(team="research", bundles=(8,), node_group=group, strategy=PlacementStrategy.STRICT_PACK)


def test_job_on_a_lost_node_is_requeued_and_resumes_from_s3_on_another_node(
    platform_scheduler_with: Callable[..., Any], ray_cluster: dict[str, Any], tmp_path: Path, s3_env: dict[str, str]
) -> None:
    cluster = ray_cluster["cluster"]
    node_c = cluster.add_node(
        num_cpus=4, num_gpus=8, resources=node_resources(8), labels={"switchyard/node-group": "c"}
    )
    try:
        cluster.wait_for_nodes()
        scheduler = platform_scheduler_with(POLICY, total_gpus=24)
        jobs = JobSubmissionClient(ray_cluster["dashboard_url"])
        # Groups a and b are taken, so the job's lease lands on the new node.
        fillers = {g: filler(g) for g in ("a", "b")}
        for sub in fillers.values():
            ray.get(scheduler.submit.remote(sub))
        filler_leases = {
            g: wait_for(lambda s=s: ray.get(scheduler.lease.remote(s.workload_id))) for g, s in fillers.items()
        }
        spec = {
            "name": JOB,
            "steps": 40,
            "seed": 0,
            "num_workers": 2,
            "model": {"preset": "tiny"},
            "data": {"source": "synthetic", "seq_len": 32, "micro_batch_size": 2},
            "parallel": {"strategy": "ddp"},
            "optim": {"lr": 3.0e-3, "warmup_steps": 2},
            "checkpoint": {"every_steps": 2, "keep": 3, "save_final": True, "uri": f"s3://{BUCKET}"},
        }
        config = tmp_path / "job.yaml"
        config.write_text(yaml.safe_dump(spec))
        entry = f"{sys.executable} -m train_jobs.run {config}"
        train = training_submission(JOB, 2, "research", entrypoint=entry).model_copy(
            update={"runtime_env": {"env_vars": s3_env}}
        )
        ray.get(scheduler.submit.remote(train))
        grant = wait_for(lambda: ray.get(scheduler.lease.remote(train.workload_id)), timeout=30)
        assert grant.placements[0].node_id == node_c.node_id
        first_job = f"{train.workload_id}-1"
        try:
            wait_for(checkpoints_in_s3, timeout=180)
        except AssertionError:
            logs = jobs.get_job_logs(first_job)[-4000:]
            raise AssertionError(f"no checkpoint in S3; job {first_job}:\n{logs}") from None

        # The node goes away mid-run.
        cluster.remove_node(node_c)
        try:
            wait_for(lambda: "node_lost" in [e["kind"] for e in ray.get(scheduler.events.remote(train.workload_id))])
        except AssertionError:
            alive = [n["Alive"] for n in ray.nodes() if n["NodeID"] == node_c.node_id]
            status = ray.get(scheduler.status.remote())
            raise AssertionError(f"node c alive in Ray: {alive}; scheduler: {status}") from None
        assert train.workload_id in ray.get(scheduler.status.remote())["pending"]
        wait_job_end(jobs, first_job, timeout=120)
        assert jobs.get_job_status(first_job) in (JobStatus.FAILED, JobStatus.STOPPED)
        saved = checkpoints_in_s3()

        # GPUs free up on node group a: it is admitted there, launched again and resumes.
        ray.get(scheduler.release.remote(filler_leases["a"].lease_id, True))
        second_job = f"{train.workload_id}-2"
        wait_for(lambda: second_job in {j.submission_id for j in jobs.list_jobs()}, timeout=30)
        done = last_json_line(wait_job_end(jobs, second_job, timeout=240))
        assert done["status"] == "completed" and done["step"] == 40
        # From the last checkpoint the lost run saved, in S3, before it reached the end.
        assert done["resumed_from"] == saved[-1] and 0 < int(saved[-1].rsplit("-", 1)[1]) < 40
        events = [e for e in ray.get(scheduler.events.remote(train.workload_id)) if e["kind"] != "job_stopped"]
        kinds = [e["kind"] for e in events]
        assert kinds == ["submitted", "admitted", "node_lost", "admitted", "resumed", "released"]
        assert events[3]["nodes"] == [ray_cluster["nodes"]["a"]]
        assert events[4]["checkpoint"] == saved[-1]
        ray.get(scheduler.release.remote(filler_leases["b"].lease_id, True))
    finally:
        if any(n["NodeID"] == node_c.node_id and n["Alive"] for n in ray.nodes()):
            cluster.remove_node(node_c)
