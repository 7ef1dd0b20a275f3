"""Fixtures for the training tests: tiny job specs, spawned process groups, a local Ray
cluster and a local S3 (moto) server.

Tests that start Ray are marked `ray` and must run under `flock /tmp/switchyard-ray.lock`.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import _workers  # tests/train is on sys.path; spawned children import it by name
import pytest
import torch
import torch.distributed as dist
from _workers import tiny_spec

from switchyard.ports import listener_port
from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.launch import spawn_group
from switchyard.train.loop import RunContext
from switchyard.train.spec import JobSpec

SpecFactory = Callable[..., JobSpec]


@pytest.fixture
def make_spec() -> SpecFactory:
    return tiny_spec


def one_rank_context(tmp_path: Path, job_id: str = "one", **overrides: Any) -> RunContext:
    """A `RunContext` for rank 0 of 1 on the CPU, in this process (inside `one_rank_group`)."""
    return RunContext(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        job_id=job_id,
        store=CheckpointStore(str(tmp_path / "ckpt"), tmp_path / "cache"),
        work_dir=tmp_path / "work",
        handle_sigterm=False,
        **overrides,
    )


@pytest.fixture
def one_rank_group() -> Iterator[None]:
    """A gloo group of this process alone: the trainer's collectives, in the test's process."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{listener_port()}", rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_jobs(jobs: list[dict[str, Any]], nproc: int) -> list[dict[str, Any]]:
    """Train each job (`_workers.job(...)`) in one spawned group of `nproc` gloo ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        spawn_group(_workers.run_jobs, nproc, jobs, str(out), finished=out.is_file)
        results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


@pytest.fixture
def s3_bucket(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A moto S3 server on 127.0.0.1 with bucket `ckpt`; boto3 (here and in spawned
    children, which inherit the environment) is pointed at it with dummy credentials."""
    from moto.server import ThreadedMotoServer

    port = listener_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    import boto3

    boto3.client("s3").create_bucket(Bucket="ckpt")
    try:
        yield "s3://ckpt"
    finally:
        server.stop()
