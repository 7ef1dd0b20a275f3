"""Fixtures shared by the whole suite.

One Ray cluster per test session (`ray_cluster`): Ray takes ~10 s to start here, so every
test that needs Ray shares it. It has 8 logical GPUs and the platform's environment (token
auth on, HAProxy ingress), its own temp dir and ports, so it never collides with a cluster a
developer is running.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def policies_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped policies, for tests that break or change them."""
    dst = tmp_path / "policies"
    shutil.copytree(REPO / "policies", dst)
    return dst


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, str]]:
    from switchyard.cluster.head import PLATFORM_ENV, free_port

    os.environ.update(PLATFORM_ENV)
    import ray

    temp_dir = tempfile.mkdtemp(prefix="syt-", dir="/tmp")
    context = ray.init(
        address="local",
        num_cpus=8,
        num_gpus=8,
        labels={"switchyard/node-group": "local"},
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=free_port(),
        namespace="switchyard",
        _temp_dir=temp_dir,
        log_to_driver=False,
    )
    try:
        yield {"gcs_address": context.address_info["gcs_address"], "dashboard_url": f"http://{context.dashboard_url}"}
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
