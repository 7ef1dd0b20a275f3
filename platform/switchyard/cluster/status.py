"""One picture of the running platform: nodes and GPUs, who holds them, Serve, queues, policy.

Read from Ray's own APIs (nodes, the state API's actors, Serve's status) and from the
scheduler actor, so `switchyard status` and the Ray dashboard always agree.
"""

from __future__ import annotations

import json
import logging
import urllib.error
import urllib.request
from typing import Any

import ray
from ray import serve
from ray.util.state import list_actors
from ray.util.state.exception import RayStateApiException

from switchyard.cluster.policy_publisher import find_publisher
from switchyard.cluster.record import PlatformRecord
from switchyard.cluster.scheduler_client import RetryPolicy, platform_scheduler

log = logging.getLogger(__name__)

# The state API is served by the dashboard, which a busy cluster can leave hanging: `status` is
# what an operator runs then, so it waits this long for it (not the API's 30 s) and shows the rest.
STATE_API_TIMEOUT_S = 10


def gpu_division(ray_address: str) -> dict[str, Any]:
    """GPUs held by Serve replicas, by training (and any other GPU actor), and free. Serve's
    share comes from the state API: when the dashboard does not answer, it is None and
    `error` says why."""
    total = ray.cluster_resources().get("GPU", 0.0)
    free = ray.available_resources().get("GPU", 0.0)
    try:
        actors = list_actors(
            address=ray_address,
            filters=[("state", "=", "ALIVE")],
            detail=True,
            limit=10_000,
            timeout=STATE_API_TIMEOUT_S,
        )
    except RayStateApiException as exc:
        log.info("state API: %s", exc)
        error = f"the Ray dashboard did not answer in {STATE_API_TIMEOUT_S} s: Serve's share of the GPUs is unknown"
        return {"total": total, "serve": None, "train": None, "free": free, "error": error}
    serve_gpus = 0.0
    for actor in actors:
        gpus = float((actor.required_resources or {}).get("GPU", 0.0))
        if gpus and actor.class_name.startswith("ServeReplica"):
            serve_gpus += gpus
    return {"total": total, "serve": serve_gpus, "train": max(0.0, total - free - serve_gpus), "free": free}


def nodes() -> list[dict[str, Any]]:
    out = []
    for n in ray.nodes():
        if not n.get("Alive"):
            continue
        res = n.get("Resources", {})
        out.append(
            {
                "node_id": n["NodeID"][:12],
                "address": n.get("NodeManagerAddress"),
                "gpus": res.get("GPU", 0.0),
                "cpus": res.get("CPU", 0.0),
                "node_group": (n.get("Labels") or {}).get("switchyard/node-group", "default"),
            }
        )
    return out


def serve_apps() -> dict[str, Any]:
    apps: dict[str, Any] = {}
    for name, app in serve.status().applications.items():
        apps[name] = {
            "status": str(app.status.value if hasattr(app.status, "value") else app.status),
            "deployments": {
                d_name: {
                    "status": str(getattr(d.status, "value", d.status)),
                    "replicas": {str(getattr(k, "value", k)): v for k, v in d.replica_states.items()},
                }
                for d_name, d in app.deployments.items()
            },
        }
    return apps


def scheduler_status() -> dict[str, Any]:
    try:
        scheduler = platform_scheduler(RetryPolicy(call_timeout_s=30, deadline_s=30))
    except ValueError:
        return {"error": "the scheduler actor is not running"}
    return scheduler.status()


def policy_publication(record: PlatformRecord) -> dict[str, Any]:
    """The head's published policy set and the one every gateway replica serves."""
    try:
        publisher = find_publisher(record.policies_dir, record.state_dir)
    except ValueError:
        return {"error": "the policy publisher is not running"}
    result: dict[str, Any] = ray.get(publisher.status.remote(), timeout=30)
    return result


def gateway_health(url: str, api_key: str | None) -> dict[str, Any]:
    """The gateway's health detail (policy state, circuits), which needs an operator key."""
    if not api_key:
        return {"ok": False, "error": "no operator key to read the gateway's status with (pass --api-key)"}
    request = urllib.request.Request(f"{url}/v1/switchyard/status", headers={"Authorization": f"Bearer {api_key}"})
    try:
        with urllib.request.urlopen(request, timeout=5) as resp:
            body: dict[str, Any] = json.loads(resp.read())
            return {"ok": True, **body}
    except urllib.error.HTTPError as exc:
        return {"ok": False, "error": f"the gateway at {url} refused the status request (HTTP {exc.code})"}
    except OSError as exc:
        return {"ok": False, "error": f"gateway not reachable at {url}: {exc}"}


def collect(record: PlatformRecord, api_key: str | None = None) -> dict[str, Any]:
    """Everything `switchyard status` shows. The caller has connected to the cluster."""
    return {
        "ray_address": record.ray_address,
        "dashboard_url": record.dashboard_url,
        "gateway_url": record.gateway_url,
        "console_url": record.console_url,
        "nodes": nodes(),
        "gpus": gpu_division(record.ray_address),
        "serve": serve_apps(),
        "scheduler": scheduler_status(),
        "gateway": gateway_health(record.gateway_url, api_key),
        "policy": policy_publication(record),
    }
