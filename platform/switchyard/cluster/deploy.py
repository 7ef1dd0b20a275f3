"""Put the platform's long-lived parts on a Ray cluster, and take exactly those off again.

The gateway is deployed by import path, as `serve deploy` does with a config file: the
platform package never imports the apps built on it (an import-linter contract), and an
operator can point the path at another build of the gateway.
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any

import ray
from ray import serve
from ray.exceptions import GetTimeoutError, RayActorError
from ray.serve import RunTarget

from switchyard.cluster.actor_readiness import wait_for_actor
from switchyard.cluster.app_readiness import APPS_READY_WITHIN_S, wait_until_running
from switchyard.cluster.grant_holds import remove_holds
from switchyard.cluster.ledger import stop_ledger_actor
from switchyard.cluster.occupant import ClusterOccupant
from switchyard.cluster.placement import on_head
from switchyard.cluster.policy_publisher import find_publisher, policy_publisher
from switchyard.cluster.record import CONSOLE_APP, GATEWAY_APP, NAMESPACE, SCHEDULER_ACTOR
from switchyard.cluster.scheduler_actor import SchedulerActor
from switchyard.cluster.serve_configs import PLATFORM_APPS, max_replicas
from switchyard.scheduler.core.config import load_policy_file

log = logging.getLogger(__name__)

GATEWAY_IMPORT_PATH = "serve_apps.gateway:build_app"
CONSOLE_IMPORT_PATH = "serve_apps.console:build_app"
CONSOLE_ROUTE = "/console"


def _run_app(app: Any, name: str, route_prefix: str, ready_within_s: float) -> None:
    """Deploy `app` and wait for it to run, at most `ready_within_s` (`serve.run` waits without
    bound); `AppNotRunning` names what is stuck."""
    serve.run_many([RunTarget(app, name=name, route_prefix=route_prefix)], wait_for_applications_running=False)
    wait_until_running(name, ready_within_s)


def _import_builder(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def start_scheduler(policies_dir: Path, state_dir: Path, dashboard_url: str | None) -> Any:
    """The one scheduler: a named, detached actor; an existing one is reused, never duplicated."""
    return SchedulerActor.options(  # type: ignore[attr-defined]
        name=SCHEDULER_ACTOR,
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        num_cpus=0,  # it decides; it does not compute
        max_restarts=-1,  # restarted by Ray; it recovers its queues from SQLite
        max_task_retries=3,
        **on_head(),  # its journal is on the head's disk
    ).remote(str(policies_dir), str(state_dir), dashboard_url)


def cluster_occupant(timeout_s: float) -> ClusterOccupant:
    """What of a switchyard platform runs on the cluster this driver is attached to."""
    apps = frozenset(serve.status().applications)  # no Serve yet: no applications
    try:
        scheduler = ray.get_actor(SCHEDULER_ACTOR, namespace=NAMESPACE)
    except ValueError:
        return ClusterOccupant(scheduler=False, state_dir=None, serve_apps=apps)
    try:
        owner = ray.get(scheduler.state_dir.remote(), timeout=timeout_s)
    except AttributeError:  # a scheduler from before `state_dir`
        owner = None
    except (GetTimeoutError, RayActorError) as exc:  # restarting, or stuck: alive, but whose is unknown
        log.warning("the cluster's scheduler did not say its state dir: %s", exc)
        owner = None
    return ClusterOccupant(scheduler=True, state_dir=owner, serve_apps=apps)


def local_model_args(policies_dir: Path, gpus_per_replica: int) -> dict[str, str]:
    """The gateway app's args that put the local model on GPUs in the inference pool: its
    replicas count against team `inference`, so their bound is that team's inference quota."""
    if gpus_per_replica <= 0:
        return {}
    policy = load_policy_file(policies_dir / "scheduler.yaml").to_policy()
    bound = max_replicas(policy, PLATFORM_APPS[GATEWAY_APP], gpus_per_replica)
    return {"local_model_gpus": str(gpus_per_replica), "local_model_max_replicas": str(bound)}


def deploy_gateway(
    policies_dir: Path,
    state_dir: Path,
    port: int,
    import_path: str = GATEWAY_IMPORT_PATH,
    local_model_gpus: int = 0,
    app_args: dict[str, str] | None = None,
    ready_within_s: float = APPS_READY_WITHIN_S,
) -> str:
    """Deploy the gateway app; returns its URL. Serve keeps the HTTP port it was first started
    with, so on a cluster where Serve already runs the app is reached at that port. With
    `local_model_gpus`, the local model's replicas take that many GPUs each, in the inference
    pool (the deployment waits until the scheduler has GPUs for its first replica). Raises
    `AppNotRunning` if the app is not running within `ready_within_s`."""
    # Replicas serve the set the head publishes; its policy files load, or no gateway deploys.
    wait_for_actor("policy publisher", policy_publisher(policies_dir, state_dir).status.remote, ready_within_s)
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    from ray.serve.context import _get_global_client

    port = _get_global_client().http_config.port
    args = {"policies_dir": str(policies_dir), "state_dir": str(state_dir)}
    app = _import_builder(import_path)({**args, **local_model_args(policies_dir, local_model_gpus), **(app_args or {})})
    _run_app(app, GATEWAY_APP, "/", ready_within_s)
    return f"http://127.0.0.1:{port}"


def deploy_console(
    policies_dir: Path,
    state_dir: Path,
    gateway_url: str,
    import_path: str = CONSOLE_IMPORT_PATH,
    ready_within_s: float = APPS_READY_WITHIN_S,
) -> str:
    """Deploy the web console as its own app on the gateway's Serve port; returns its URL.
    Raises `AppNotRunning` if the app is not running within `ready_within_s`."""
    app = _import_builder(import_path)(
        {"policies_dir": str(policies_dir), "state_dir": str(state_dir), "gateway_url": gateway_url}
    )
    _run_app(app, CONSOLE_APP, CONSOLE_ROUTE, ready_within_s)
    return f"{gateway_url}{CONSOLE_ROUTE}/"


def undeploy(shutdown_serve: bool, policies_dir: Path, state_dir: Path) -> None:
    """Remove the console and gateway apps, the scheduler, the policy publisher and the ledger
    actor; Serve itself only if we started it."""
    for app in (CONSOLE_APP, GATEWAY_APP):
        try:
            serve.delete(app)
        except Exception as exc:  # noqa: BLE001 - Serve raises several types; we report and go on
            log.warning("could not delete the Serve app %r: %s", app, exc)
    if shutdown_serve:
        serve.shutdown()
    try:
        ray.kill(ray.get_actor(SCHEDULER_ACTOR, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        log.info("no scheduler actor to stop")
    removed = remove_holds(SCHEDULER_ACTOR)  # detached: they would hold Serve slots on a cluster we attached to
    if removed:
        log.info("removed the scheduler's %d grant holds", removed)
    # After the apps: a replica stopping sends its queued charges to the ledger first.
    stop_own_actors(policies_dir, state_dir)


def stop_own_actors(policies_dir: Path, state_dir: Path) -> None:
    """Stop the actors named after this platform's state dir alone (the policy publisher and the
    ledger), leaving the cluster's apps and scheduler, which may be another platform's."""
    try:
        ray.kill(find_publisher(policies_dir, state_dir), no_restart=True)
    except ValueError:
        log.info("no policy publisher to stop")
    if not stop_ledger_actor(state_dir):
        log.info("no ledger actor to stop")
