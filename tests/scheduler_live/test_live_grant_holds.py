"""Granted GPUs are held against Serve: a Serve replica that Ray could place on GPUs granted to a
training job that is still starting waits instead, and lands once the grant is over.

    RAY_ADDRESS= flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/scheduler_live/test_live_grant_holds.py
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
import ray

from switchyard.cluster.admission import RAY_NODE_ID_KEY
from switchyard.cluster.grant_holds import serve_gpu_options
from switchyard.cluster.serve_pool import replica_from_actor
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy
from tests.scheduler_live.conftest import wait_for

pytestmark = pytest.mark.ray

# Team vision has no inference quota in TEST_POLICY: the scheduler never grants its replica
# anything, so where the replica runs is Ray's decision alone, which is what this test watches.
APP = "vision--pinned"
# A launched job that starts slowly: it has not claimed its lease (nor started any worker)
# for the whole test.
SLOW_START = "python -c 'import time; time.sleep(300)'"


def _replica_node(gcs_address: str) -> tuple[bool, str | None]:
    """(whether the app's GPU replica exists yet, the node Ray placed it on or None)."""
    from ray.util.state import list_actors

    rows = list_actors(address=gcs_address, filters=[("state", "!=", "DEAD")], detail=True, limit=10_000)
    replicas = [r for r in (replica_from_actor(a) for a in rows) if r is not None and r.app == APP]
    return (bool(replicas), replicas[0].node_id if replicas else None)


def _deploy_pinned(node_id: str) -> None:
    """One 1-GPU replica that may only run on `node_id`, asking for its Serve slot as every GPU
    replica the platform deploys does."""
    from ray import serve

    @serve.deployment(
        num_replicas=1,
        graceful_shutdown_timeout_s=1,
        ray_actor_options=serve_gpu_options(1, {"num_cpus": 0, "label_selector": {RAY_NODE_ID_KEY: node_id}}),
    )
    class Pinned:
        def __call__(self) -> str:
            return "ok"

    target = serve.RunTarget(Pinned.bind(), name=APP, route_prefix=None)  # type: ignore[attr-defined]
    serve.run_many([target], wait_for_applications_running=False)


def test_serve_replica_waits_instead_of_taking_gpus_granted_to_a_starting_job(
    scheduler_factory: Callable[..., Any], ray_cluster: dict[str, Any], serve_http: str
) -> None:
    from ray import serve

    gcs, node_a = ray_cluster["gcs_address"], ray_cluster["nodes"]["a"]
    scheduler = scheduler_factory()
    gang = WorkloadSubmission(
        team="research",
        bundles=(8,),
        node_group="a",
        strategy=PlacementStrategy.STRICT_PACK,
        entrypoint=SLOW_START,
        description="a job that takes its time to start",
    )
    ray.get(scheduler.submit.remote(gang))
    cancelled = False
    try:
        grant = wait_for(lambda: ray.get(scheduler.lease.remote(gang.workload_id)), timeout=30)
        assert [(p.node_id, p.gpus) for p in grant.placements] == [(node_a, 8)]
        # Every GPU of node a is granted and none is used yet: Ray sees them all free.
        wait_for(lambda: ray.available_resources().get("GPU", 0) == 16, timeout=10)

        _deploy_pinned(node_a)
        wait_for(lambda: _replica_node(gcs)[0], timeout=60)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # it waits in Ray, however long the job takes
            assert _replica_node(gcs) == (True, None), "a Serve replica took GPUs granted to a starting job"
            time.sleep(0.5)
        assert ray.get(scheduler.lease.remote(gang.workload_id)) == grant  # the grant was never disturbed
        assert ray.available_resources().get("GPU", 0) == 16

        # The grant ends (here: cancelled): its GPUs are Serve's to take again.
        ray.get(scheduler.cancel.remote(gang.workload_id))
        cancelled = True
        assert wait_for(lambda: _replica_node(gcs)[1], timeout=60) == node_a
    finally:
        serve.delete(APP)
        if not cancelled:
            ray.get(scheduler.cancel.remote(gang.workload_id))
