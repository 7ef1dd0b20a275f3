"""Serve in the inference pool, live: the scheduler adopts a team's GPU replicas, and when Serve
scales up while training has borrowed every GPU, it reclaims one through the preemption path and
the pending replica lands on exactly the GPU that was freed for it.

    RAY_ADDRESS= flock /tmp/switchyard-ray.lock .venv/bin/python -m pytest tests/scheduler_live/test_live_serve_pool.py
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest
import ray

from switchyard.cluster.admission import RAY_NODE_ID_KEY
from switchyard.cluster.serve_pool import reclaim_chains, replica_from_actor
from switchyard.scheduler.api import WorkloadSubmission
from tests.scheduler_live.conftest import wait_for

pytestmark = pytest.mark.ray

APP = "prod--echo"  # team prod (TEST_POLICY: 8 inference GPUs guaranteed), app echo


def _replica_nodes(gcs_address: str) -> dict[str, str | None]:
    """Serve replica workload id -> the node Ray placed it on (None while it waits)."""
    from ray.util.state import list_actors

    rows = list_actors(address=gcs_address, filters=[("state", "!=", "DEAD")], detail=True, limit=10_000)
    replicas = [r for r in (replica_from_actor(a) for a in rows) if r is not None and r.app == APP and r.gpus]
    return {r.workload_id: r.node_id for r in replicas}


def _deploy() -> None:
    from ray import serve

    from serve_apps.team_example import Front, Tagger

    # The team's app: a CPU front and its GPU deployment, one logical GPU per replica (the
    # replica does nothing heavy). The GPU deployment is scaled from outside (Serve's external
    # scaler API), as a burst would make Serve scale it: redeploying with another num_replicas
    # would roll every replica instead.
    quick = {"graceful_shutdown_timeout_s": 1, "graceful_shutdown_wait_loop_s": 0.5}  # it serves nothing
    app = Front.bind(Tagger.options(num_replicas=1, **quick).bind())  # type: ignore[attr-defined]
    target = serve.RunTarget(app, name=APP, route_prefix=None, external_scaler_enabled=True)
    serve.run_many([target], wait_for_applications_running=False)


def _scale(replicas: int) -> None:
    """What `POST /api/v1/applications/<app>/deployments/<deployment>/scale` does."""
    from ray.serve._private.common import DeploymentID
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    controller = ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
    ray.get(controller.update_deployment_replicas.remote(DeploymentID(name="tagger", app_name=APP), replicas))


def test_pending_replica_reclaims_a_borrowed_gpu(
    scheduler_factory: Callable[..., Any], ray_cluster: dict[str, Any], serve_http: str
) -> None:
    from ray import serve
    from ray.util.placement_group import placement_group, remove_placement_group

    from switchyard.cluster.preemption_channel import GcsPreemptionChannel

    gcs = ray_cluster["gcs_address"]
    actor = scheduler_factory()
    job_id = ray.get_runtime_context().get_job_id()
    held: dict[str, Any] = {}  # workload -> the placement group standing in for its job's workers
    leases: dict[str, Any] = {}
    try:
        # 1. One replica runs: the scheduler adopts it where Ray put it.
        _deploy()
        first = wait_for(lambda: (n := _replica_nodes(gcs)) and all(n.values()) and n, timeout=60)
        ((first_wid, first_node),) = first.items()
        pool = wait_for(
            lambda: (p := ray.get(actor.status.remote())["serve_pool"])["leased"] and p["leased"][0]["running"] and p,
            timeout=30,
        )
        assert pool["leased"] == [{"workload_id": first_wid, "team": "prod", "nodes": [first_node], "running": True}]

        # 2. Training fills the other 15 GPUs, 7 of them borrowed from prod's idle guarantee. Each
        #    lease really holds its GPUs in Ray (a placement group on the granted node, claimed
        #    by this driver's job), as a training job's workers would.
        for team, gpus in (("research", 4), ("research", 4), ("vision", 4), ("vision", 3)):
            sub = WorkloadSubmission(team=team, bundles=(gpus,))
            ray.get(actor.submit.remote(sub))
            lease = wait_for(lambda s=sub: ray.get(actor.lease.remote(s.workload_id)), timeout=30)
            ray.get(actor.claim.remote(sub.workload_id, job_id))
            node = lease.placements[0].node_id
            pg = placement_group(
                [{"GPU": gpus, "CPU": 0}], strategy="STRICT_PACK", bundle_label_selector=[{RAY_NODE_ID_KEY: node}]
            )
            ray.get(pg.ready(), timeout=30)
            held[sub.workload_id], leases[sub.workload_id] = pg, lease
        # Ray's resource view catches up with the placement groups asynchronously (CI once
        # read 3 GPUs free right after the last group was ready): every GPU held, in time.
        wait_for(lambda: ray.available_resources().get("GPU", 0) == 0, timeout=10)
        borrowers = {w for w, lease in leases.items() if lease.borrowing}
        assert len(borrowers) == 2

        # 3. Serve scales up: the new replica waits in Ray, and the scheduler reclaims for it.
        _scale(2)

        def noticed() -> tuple[str, Any] | None:
            for wid in leases:
                notice = ray.get(actor.preemption_notice.remote(wid))
                if notice is not None:
                    return wid, notice
            return None

        victim, notice = wait_for(noticed, timeout=60)
        pending_wid = next(w for w, n in _replica_nodes(gcs).items() if w != first_wid)
        assert victim in borrowers and notice.reason == f"reclaim for {pending_wid}"
        assert _replica_nodes(gcs)[pending_wid] is None  # still waiting: no GPU is free in Ray
        # A job learns of its notice through the training preemption channel, not the actor.
        from switchyard.cluster.preemption_channel import GcsPreemptionChannel

        assert wait_for(lambda: GcsPreemptionChannel().poll(victim), timeout=10).reason == notice.reason

        # 4. The victim reacts like a job: checkpoint, give its GPUs back, exit resumable.
        freed_node = leases[victim].placements[0].node_id
        ray.get(actor.report_checkpoint.remote(victim))
        remove_placement_group(held.pop(victim))
        assert ray.get(actor.release.remote(leases.pop(victim).lease_id, False)) is True

        # 5. The replica runs on the GPU freed for it, which is the one the scheduler granted.
        placed = wait_for(lambda: _replica_nodes(gcs)[pending_wid], timeout=60)
        assert placed == freed_node
        grant = wait_for(
            lambda: (g := ray.get(actor.lease.remote(pending_wid))) and g.placements[0].node_id == placed and g,
            timeout=30,
        )
        assert grant.team == "prod" and grant.placements[0].gpus == 1
        last: list[Any] = []

        def both_running() -> Any:
            last[:] = [ray.get(actor.status.remote())["serve_pool"]]
            leased = last[0]["leased"]
            return len(leased) == 2 and all(r["running"] for r in leased) and last[0]

        try:
            pool = wait_for(both_running, timeout=30)
        except AssertionError:
            raise AssertionError(f"serve pool: {last}; events: {ray.get(actor.events.remote(pending_wid))}") from None
        assert pool["pending"] == [] and pool["outside_lease"] == []

        # 6. The cause chain is in the event log.
        events = ray.get(actor.events.remote())
        chain = next(c for c in reclaim_chains(events) if c["workload_id"] == pending_wid)
        assert chain["complete"] and chain["victims"] == [victim], json.dumps([chain, events], indent=0)
        kinds = [s["kind"] for s in chain["steps"]]
        assert kinds[:4] == ["replica_pending", "reclaim_decision", "preemption_notice", "requeued"]
        assert kinds[4] in ("admitted", "adopted") and kinds[5:] == ["replica_running"]
    finally:
        # The CPU front drains for 30 s in the background; the GPU replicas go at once. The
        # groups go first: a wait that times out here must not leave GPUs held for the next test.
        serve.delete(APP, _blocking=False)
        for pg in held.values():
            remove_placement_group(pg)
        for wid in leases:
            GcsPreemptionChannel().clear(wid)
        wait_for(lambda: not _replica_nodes(gcs), timeout=120)
