"""The supervisor of a local platform: owns one Ray head, the scheduler and the gateway.

`switchyard up` (without --address) runs this module as a background process. The cluster
lives exactly as long as this process: on SIGTERM it removes the gateway and the scheduler,
shuts Ray down (which stops the processes Ray started for it, and only those), and deletes
its record. That is how `switchyard down` stops what `up` started without `ray stop`.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

from switchyard.cluster.app_readiness import APPS_READY_WITHIN_S, PlatformNotRunning
from switchyard.cluster.record import NAMESPACE, PlatformRecord, clear_record, write_record
from switchyard.cluster.supervisor import StateDirTaken, claim_state_dir
from switchyard.ports import listener_port

log = logging.getLogger("switchyard.head")

PLATFORM_ENV = {
    "RAY_AUTH_MODE": "token",  # Ray 2.60's default, stated explicitly: the platform runs with it on
    "RAY_SERVE_ENABLE_HA_PROXY": "1",  # ~10x the default proxy's throughput here
}
HEAD_NODE_GROUP = "local"
FAILURE_FILE = "head.failure"  # under <state>/logs: why the head gave up, for `up` to show as is


def failure_path(state_dir: Path) -> Path:
    return state_dir / "logs" / FAILURE_FILE


def short_temp_dir(state_dir: Path) -> Path:
    """Ray's Unix socket paths must stay under ~107 bytes, so the temp dir is short and unique
    per state directory (two platforms on one machine never share one)."""
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:8]
    return Path(tempfile.gettempdir()) / f"sy-{digest}"


def run_head(
    state_dir: Path,
    policies_dir: Path,
    gpus: int,
    cpus: int,
    demo: bool,
    local_model_gpus: int = 0,
    apps_ready_within_s: float = APPS_READY_WITHIN_S,
) -> None:
    claim_state_dir(state_dir)  # held until this process exits: one supervisor, one cluster, per state dir
    temp_dir = short_temp_dir(state_dir)
    temp_dir.mkdir(exist_ok=True)
    os.environ.update(PLATFORM_ENV)
    # HAProxy's stats and metrics listeners have fixed default ports on all interfaces; a second
    # platform on the same machine (a developer's, a test's) must not collide with the first.
    os.environ.setdefault("RAY_SERVE_HAPROXY_STATS_PORT", str(listener_port()))
    os.environ.setdefault("RAY_SERVE_HAPROXY_METRICS_PORT", str(listener_port()))
    # Ray records "the current cluster" under $RAY_TMPDIR/ray, where a bare `ray.init()` would
    # find and attach to it; keep that record inside our own directory.
    os.environ["RAY_TMPDIR"] = str(temp_dir)
    import ray  # after the environment: Ray reads it at import and init

    from switchyard.cluster.actor_readiness import wait_for_actor
    from switchyard.cluster.deploy import deploy_console, deploy_gateway, start_scheduler, undeploy
    from switchyard.cluster.grant_holds import node_resources

    context = ray.init(
        address="local",
        num_gpus=gpus,
        num_cpus=cpus,
        resources=node_resources(gpus),  # the Serve slots that grants hold (`grant_holds`)
        labels={"switchyard/node-group": HEAD_NODE_GROUP},
        include_dashboard=True,
        dashboard_host="127.0.0.1",
        dashboard_port=listener_port(),
        namespace=NAMESPACE,
        _temp_dir=str(temp_dir / "ray"),
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    try:
        dashboard = context.dashboard_url
        scheduler = start_scheduler(policies_dir, state_dir, f"http://{dashboard}" if dashboard else None)
        wait_for_actor("scheduler", scheduler.ping.remote, apps_ready_within_s)
        gateway_url = deploy_gateway(
            policies_dir,
            state_dir,
            listener_port(),
            local_model_gpus=local_model_gpus,
            app_args=_app_args(state_dir, demo),
            ready_within_s=apps_ready_within_s,
        )
        console_url = deploy_console(policies_dir, state_dir, gateway_url, ready_within_s=apps_ready_within_s)
        write_record(
            state_dir,
            PlatformRecord(
                ray_address=context.address_info["gcs_address"],
                dashboard_url=f"http://{dashboard}" if dashboard else None,
                gateway_url=gateway_url,
                console_url=console_url,
                owns_cluster=True,
                supervisor_pid=os.getpid(),
                ray_temp_dir=str(temp_dir),
                policies_dir=str(policies_dir),
                state_dir=str(state_dir),
                gpus=gpus,
                demo=demo,
                started_at=time.time(),
            ),
        )
        log.info("platform up; waiting for SIGTERM")
        stop.wait()
    finally:
        log.info("stopping: removing the gateway and scheduler, shutting Ray down")
        try:
            undeploy(shutdown_serve=True, policies_dir=policies_dir, state_dir=state_dir)
        finally:
            ray.shutdown()
            clear_record(state_dir)


def _app_args(state_dir: Path, demo: bool) -> dict[str, str]:
    """The gateway app's knobs. The local model serves the newest checkpoint of the demo's
    training job when there is one; the demo scales Serve in seconds, not minutes, so the whole
    story (burst -> scale up -> reclaim -> burst ends -> scale down -> resume) fits its run."""
    args = {"checkpoints_dir": str(state_dir / "train" / "checkpoints")}
    if demo:
        # Two replicas from the start, so the burst adds one at a time up to the quota of 3.
        args.update(
            {"local_model_min_replicas": "2", "local_model_upscale_delay_s": "2", "local_model_downscale_delay_s": "8"}
        )
    return args


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--state-dir", required=True)
    parser.add_argument("--policies", required=True)
    parser.add_argument("--gpus", type=int, required=True)
    parser.add_argument("--cpus", type=int, required=True)
    parser.add_argument("--demo", action="store_true")
    parser.add_argument("--local-model-gpus", type=int, default=0)
    parser.add_argument("--apps-ready-within", type=float, default=APPS_READY_WITHIN_S)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        run_head(
            Path(args.state_dir),
            Path(args.policies),
            args.gpus,
            args.cpus,
            args.demo,
            args.local_model_gpus,
            args.apps_ready_within,
        )
    except (PlatformNotRunning, StateDirTaken) as exc:  # it stopped (or never started): `up` shows why
        log.error("%s", exc)
        failure_path(Path(args.state_dir)).write_text(f"{exc}\n")
        sys.exit(1)


if __name__ == "__main__":
    main()
