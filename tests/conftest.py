"""Fixtures shared by the whole suite.

One Ray cluster per test session (`ray_cluster`): Ray takes ~10 s to start here, so every
test that needs Ray shares it. It is a fake multi-node GPU cluster (`ray.cluster_utils.Cluster`,
logical GPUs, node-group labels) with the platform's environment (token auth on, HAProxy
ingress), its own temp dir and ports, so it never collides with a cluster a developer runs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from switchyard.db.engine import Database

REPO = Path(__file__).resolve().parents[1]

pytest_plugins = ["tests.shared_db"]  # the `backend` fixture: every store test on SQLite and Postgres


def pytest_configure(config: pytest.Config) -> None:
    # Before any test module imports ray: Ray reads its auth mode once, at import.
    from switchyard.cluster.head import PLATFORM_ENV
    from switchyard.ports import listener_port

    os.environ.update(PLATFORM_ENV)
    # The session cluster's HAProxy listeners must not take the fixed default ports that the
    # platform a test starts with `switchyard up` (or a developer's) would use.
    os.environ["RAY_SERVE_HAPROXY_STATS_PORT"] = str(listener_port())
    os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"] = str(listener_port())
    # Ray Train V2's controller checks faster with these: 16-21 s per fit() here instead of 20-29 s.
    os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.25")
    os.environ.setdefault("RAY_TRAIN_ENABLE_PREEMPTION_WATCHER", "0")
    os.environ.setdefault("RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION", "0")
    # A Serve replica being removed stays reachable this long so load balancers deregister it
    # (30 s by default); HAProxy here reloads its backends within a second, and every gateway
    # app a test module removes would otherwise cost the suite 30 s.
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "3")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Tests that start a Ray cluster of their own (`switchyard up` on a fresh head) run first,
    # before the shared session cluster exists: two clusters on one machine contend for
    # HAProxy's listeners and Ray's worker ports.
    items.sort(key=lambda item: 0 if item.get_closest_marker("own_cluster") else 1)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture
def policies_copy(tmp_path: Path) -> Path:
    """A writable copy of the shipped policies, for tests that break or change them."""
    dst = tmp_path / "policies"
    shutil.copytree(REPO / "policies", dst)
    return dst


@pytest.fixture
def ledger_db(backend: str, tmp_path: Path) -> Iterator[Database]:
    """The budget ledger's database on `backend`: `ledger.db` in the test's temp dir, or a fresh
    Postgres with the ledger's schema. The budget and gateway tests build their ledgers on it."""
    # Imported here: the ledger only by the tests that use it, and a module imported before
    # `pytest_plugins` names it would not be assert-rewritten.
    from switchyard.budgets.ledger import SCHEMA
    from tests.shared_db import store_database

    db = store_database(backend, tmp_path / "ledger.db", SCHEMA)
    try:
        yield db
    finally:
        db.close()


GPU_NODE_GROUPS = ("a", "b")  # two 8-GPU nodes: enough for gang, group and preemption tests
GPUS_PER_NODE = 8


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[dict[str, Any]]:
    """A fake multi-node GPU cluster: a CPU head plus two 8-GPU nodes in node groups a and b."""
    import ray
    from ray.cluster_utils import Cluster

    from switchyard.cluster.grant_holds import node_resources
    from switchyard.ports import listener_port

    # `Cluster` starts a GCS that needs a token and, unlike `ray.init` or `ray start`, makes none:
    # on a fresh machine (no ~/.ray/auth_token) a suite run alone would fail to start it.
    ray_cli = Path(sys.executable).with_name("ray")
    subprocess.run([str(ray_cli), "get-auth-token", "--generate"], check=True, capture_output=True)
    temp_dir = tempfile.mkdtemp(prefix="syt-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    # Ray writes "the current cluster" file under $RAY_TMPDIR/ray; ours must not be the machine's.
    os.environ["RAY_TMPDIR"] = temp_dir
    cluster = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 4,
            "num_gpus": 0,
            "labels": {"switchyard/node-group": "head"},
            "include_dashboard": True,
            "dashboard_host": "127.0.0.1",
            "dashboard_port": listener_port(),
        },
    )
    nodes = {
        group: cluster.add_node(
            num_cpus=4,
            num_gpus=GPUS_PER_NODE,
            resources=node_resources(GPUS_PER_NODE),
            labels={"switchyard/node-group": group},
        )
        for group in GPU_NODE_GROUPS
    }
    cluster.wait_for_nodes()
    context = ray.init(address=cluster.address, namespace="switchyard", log_to_driver=False)
    try:
        yield {
            "cluster": cluster,
            "gcs_address": cluster.address,
            "dashboard_url": f"http://{context.dashboard_url}",
            "nodes": {g: n.node_id for g, n in nodes.items()},
        }
    finally:
        ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def serve_http(ray_cluster: dict[str, Any]) -> str:
    """Serve on the session's cluster (HAProxy ingress), started once; apps come and go."""
    from ray import serve
    from ray.serve.context import _get_global_client

    from switchyard.ports import listener_port

    serve.start(http_options={"host": "127.0.0.1", "port": listener_port()})
    return f"http://127.0.0.1:{_get_global_client().http_config.port}"
