"""Wait, with a deadline, for a Serve application to run; if it does not, say which deployment
is stuck and why.

`serve.run` waits without bound: on a cluster with no room for a replica, `switchyard up` hung
with no word. Here the wait ends, and the error names each deployment that is not healthy, the
resources each of its replicas asks for, what Serve says about it, and what the cluster has
free, so an operator can tell "no CPU for the console on the head" from "a slow start".
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from switchyard.cluster.placement import HEAD_RESOURCE

if TYPE_CHECKING:
    from ray.serve.schema import ApplicationStatusOverview

log = logging.getLogger(__name__)

APPS_READY_WITHIN_S = 180.0  # a replica's start on a loaded machine takes tens of seconds, not minutes
POLL_S = 0.5


class PlatformNotRunning(RuntimeError):
    """A part of the platform (an actor, a Serve application) did not start; the message says
    which and why, for `up` to print as it is."""


class AppNotRunning(PlatformNotRunning):
    """A Serve application failed to deploy, or did not run within its deadline."""


ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")
FRAME_STARTS = ("Traceback (most recent call last)", 'File "')


def without_frames(text: str, after_last_frame: bool = False) -> list[str]:
    """The non-empty lines of `text` (ANSI colours removed, right-stripped) that are not part
    of a Python traceback's frames: a `File "..."` line, its source line and ^^^ markers.
    `after_last_frame`: only the lines after the last frame, i.e. the error itself."""
    lines: list[str] = []
    in_frame = False
    for raw in ANSI_ESCAPE.sub("", text).splitlines():
        line = raw.rstrip()
        stripped = line.strip()
        if stripped.startswith(FRAME_STARTS):
            in_frame = True  # a frame's source line (and its ^^^ markers) follow
            if after_last_frame:
                lines = []
            continue
        if in_frame and (line.startswith("    ") or not stripped or set(stripped) <= set("^~ ")):
            continue
        in_frame = False
        if stripped:
            lines.append(line)
    return lines


@dataclass(frozen=True)
class DeploymentState:
    """What Serve reports of one deployment, as plain data."""

    name: str
    status: str  # Serve's DeploymentStatus: HEALTHY, UPDATING, UNHEALTHY, ...
    replicas: Mapping[str, int]  # replica state -> count
    message: str
    needs: Mapping[str, float]  # the resources each replica asks for


@dataclass(frozen=True)
class HeadRoom:
    """What the head node has free, and which live actors hold its CPUs: a replica pinned to
    the head waits on the head alone, whatever the other nodes have free."""

    free: Mapping[str, float]
    cpu_holders: Mapping[str, float]  # actor class (or Serve replica) -> CPUs its live actors hold


def describe_unready(
    app: str,
    app_status: str,
    app_message: str,
    deployments: list[DeploymentState],
    free: Mapping[str, float],
    deadline_s: float,
    head_room: HeadRoom | None = None,
) -> str:
    """The error for an application that is not running (by its `deadline_s`, or ever: it
    failed to deploy): one line per deployment that is not healthy, then what the cluster has
    free, and, when a stuck replica is pinned to the head, what the head has free and who
    holds its CPUs."""
    head = (
        f"the Serve application {app!r} failed to deploy"
        if app_status == "DEPLOY_FAILED"
        else f"the Serve application {app!r} was not running within {deadline_s:g}s (status {app_status})"
    )
    lines = [head + (f": {app_message}" if app_message else "")]
    stuck = [d for d in deployments if d.status != "HEALTHY"]
    for d in stuck:
        running = d.replicas.get("RUNNING", 0)
        others = ", ".join(f"{n} {state.lower()}" for state, n in sorted(d.replicas.items()) if state != "RUNNING")
        lines.append(
            f"  deployment {d.name!r} ({d.status}): {running} replica(s) running"
            + (f", {others}" if others else "")
            + f"; each replica needs {_resources(d.needs)}"
        )
        if d.message:
            lines.append(f"    Serve says: {d.message}")
    if not deployments:
        lines.append("  Serve reports no deployments for it yet")
    # Ray leaves a used-up resource out of what is free: what a stuck replica needs is shown, at 0.
    asked = {resource: 0.0 for d in stuck for resource in d.needs}
    lines.append(f"  free on the cluster now: {_resources({**asked, **free})}")
    if head_room is not None and any(HEAD_RESOURCE in d.needs for d in stuck):
        holders = ", ".join(f"{name} CPU {cpus:g}" for name, cpus in sorted(head_room.cpu_holders.items()) if cpus)
        lines.append(
            f"  free on the head node now: {_resources({'CPU': 0.0, **head_room.free})}"
            + (f"; its CPUs are held by {holders}" if holders else "")
        )
    return "\n".join(lines)


def _resources(resources: Mapping[str, float]) -> str:
    """Readable resources: a node's own `node:<ip>` tag and the object store are left out (no
    replica asks for them), memory is in GiB."""
    shown = [
        f"{k} {v / 2**30:.1f} GiB" if k == "memory" else f"{k} {v:g}"
        for k, v in sorted(resources.items())
        if k != "object_store_memory" and (not k.startswith("node:") or k == HEAD_RESOURCE)
    ]
    return ", ".join(shown) or "nothing"


def replica_needs(ray_actor_options: Mapping[str, object]) -> dict[str, float]:
    """A replica's resource request from the `ray_actor_options` Serve reports for its
    deployment. Serve has already filled in `num_cpus=1` where the deployment gave none, so an
    option missing here is one the replica does not ask for."""
    needs: dict[str, float] = {}
    for option, resource in (("num_cpus", "CPU"), ("num_gpus", "GPU"), ("memory", "memory")):
        value = ray_actor_options.get(option)
        if isinstance(value, int | float) and value:
            needs[resource] = float(value)
    custom = ray_actor_options.get("resources")
    if isinstance(custom, Mapping):
        needs.update({str(k): float(v) for k, v in custom.items() if isinstance(v, int | float)})
    return needs


def wait_until_running(app: str, within_s: float) -> None:
    """Return once Serve reports `app` RUNNING; raise `AppNotRunning` with the stuck
    deployments if it fails to deploy or is still not running after `within_s` seconds."""
    from ray import serve

    start = time.monotonic()
    while True:
        overview = serve.status().applications.get(app)
        status = _name(overview.status) if overview is not None else "NOT_STARTED"
        if status == "RUNNING":
            return
        if status == "DEPLOY_FAILED" or time.monotonic() - start >= within_s:
            raise AppNotRunning(_describe(app, overview, within_s))
        time.sleep(POLL_S)


def _name(state: object) -> str:
    """A Serve status as its name: Serve hands some out as enums and some as plain strings."""
    return str(getattr(state, "value", state))


def _describe(app: str, overview: ApplicationStatusOverview | None, deadline_s: float) -> str:
    import ray
    from ray.serve.context import _get_global_client

    details = _get_global_client().get_serve_details().get("applications", {}).get(app, {})
    configs = {name: d.get("deployment_config", {}) for name, d in (details.get("deployments") or {}).items()}
    deployments = [
        DeploymentState(
            name=name,
            status=_name(d.status),
            replicas={_name(state): n for state, n in d.replica_states.items()},
            message=d.message,
            needs=replica_needs(configs.get(name, {}).get("ray_actor_options") or {}),
        )
        for name, d in (overview.deployments.items() if overview is not None else [])
    ]
    return describe_unready(
        app,
        _name(overview.status) if overview is not None else "NOT_STARTED",
        overview.message if overview is not None else "",
        deployments,
        ray.available_resources(),
        deadline_s,
        head_room() if any(HEAD_RESOURCE in d.needs for d in deployments) else None,
    )


def head_room() -> HeadRoom | None:
    """The head's free resources and its CPU holders, or None if Ray cannot say (the error is
    still given, without this line)."""
    import ray
    from ray._private.state import available_resources_per_node  # per node: the public API sums them
    from ray.util.state import list_actors
    from ray.util.state.exception import RayStateApiException

    try:
        head = next(n["NodeID"] for n in ray.nodes() if n["Alive"] and HEAD_RESOURCE in n["Resources"])
        actors = list_actors(filters=[("node_id", "=", head), ("state", "=", "ALIVE")], detail=True, limit=10_000)
        free = available_resources_per_node().get(head, {})
    except (StopIteration, RayStateApiException, ray.exceptions.RayError) as exc:
        log.warning("could not read the head node's free resources: %s", exc)
        return None
    holders: dict[str, float] = {}
    for actor in actors:
        name = actor.class_name  # a Serve replica's names its app and deployment
        holders[name] = holders.get(name, 0.0) + float((actor.required_resources or {}).get("CPU", 0.0))
    return HeadRoom(free=free, cpu_holders=holders)
