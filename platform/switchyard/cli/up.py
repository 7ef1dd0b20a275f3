"""`switchyard up`: bring the platform up on one Ray cluster (a new local head, or ADDR)."""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from switchyard.cli._args import int_between, positive_seconds
from switchyard.cli._auth import ensure_admin_key
from switchyard.cli._output import fail, print_json
from switchyard.cluster.app_readiness import APPS_READY_WITHIN_S, PlatformNotRunning, without_frames
from switchyard.cluster.record import PlatformRecord, clear_record, read_record
from switchyard.cluster.record_liveness import address_silent, cluster_silent, stale_record_message, supervisor_gone
from switchyard.db.location import UnsafeLayout
from switchyard.paths import policies_dir
from switchyard.policy.errors import PolicyError
from switchyard.policy.keys import KeyStore
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import Role
from switchyard.state import state_dir

DEMO_TEAM = "demo"
HEAD_START_S = 150.0  # Ray's own start, before the parts' deadlines begin


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("up", help="start the platform: Ray, the scheduler and the gateway")
    p.add_argument("--address", help="attach to this Ray cluster instead of starting a local head")
    p.add_argument("--gpus", type=int_between(0, 100_000), default=8, help="logical GPUs of a local head (default 8)")
    p.add_argument(
        "--cpus",
        type=int_between(1, 10_000),
        default=max(8, os.cpu_count() or 1),
        help="logical CPUs of a local head (default: max(8, cores))",
    )
    p.add_argument("--gateway-port", type=int_between(1, 65_535), default=8000, help="Serve HTTP port when attaching")
    p.add_argument("--demo", action="store_true", help="demo policies and a fresh key for the demo team")
    p.add_argument(
        "--local-model-gpus",
        type=int_between(0, 1_024),
        default=0,
        help="GPUs per replica of the local model, in the inference pool (default 0: CPU);"
        " its replicas autoscale up to the inference quota in policies/scheduler.yaml",
    )
    p.add_argument(
        "--timeout",
        type=positive_seconds,
        default=APPS_READY_WITHIN_S,
        help="seconds each part (the scheduler, the policy publisher, the gateway, the console) may take to"
        " start before `up` gives up, undoes what it started and names the part that is stuck and why"
        f" (default {APPS_READY_WITHIN_S:.0f})",
    )
    p.add_argument("--detach", action="store_true", help="return once up, leaving it running")
    p.add_argument("--policies", help="policy directory (default: the repo's policies/)")
    p.add_argument("--state-dir", help="state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    state = state_dir(args.state_dir)
    policies = policies_dir(args.policies)
    try:
        policy_set = load_policy_set(policies)
    except PolicyError as exc:
        return fail(f"refusing to start with invalid policies:\n{exc}", 1)
    recorded = read_record(state)
    if recorded is not None:
        gone = supervisor_gone(state, recorded)
        # An attached platform has no supervisor to look at: its cluster answering is the sign
        # of life (one that went away used to be "already up", which `down` then contradicted).
        if gone is None and not recorded.owns_cluster and (silent := cluster_silent(recorded)) is not None:
            return fail(stale_record_message(state, silent))
        if gone is None:
            return fail(
                f"a platform is already up for state dir {state} "
                "(see `switchyard status`; stop it with `switchyard down`)"
            )
        # A local platform whose supervisor is gone (a reboot, a kill) left its record behind.
        print(f"switchyard: clearing the record of a platform that is not running: {gone}", file=sys.stderr)
        clear_record(state)
    if args.demo and DEMO_TEAM not in policy_set.teams:
        return fail(f"--demo needs the team {DEMO_TEAM!r} in {policies}/teams/")
    # Before anything is written: Ray's driver would retry a wrong address for minutes.
    if args.address and (silent := address_silent(args.address)) is not None:
        return fail(f"refusing to attach: the {silent}; nothing was started", 1)
    problem = _prepare_shared_state(state)
    if problem is not None:
        return fail(problem, 1)
    admin_key = ensure_admin_key(state)
    demo_key = demo_key_id = None
    if args.demo:
        with KeyStore.in_state_dir(state) as keys:
            demo_key, created = keys.create(DEMO_TEAM, Role.MEMBER, note="switchyard up --demo")
            demo_key_id = created.key_id
    try:
        record = _attach(args, state, policies) if args.address else _start_local(args, state, policies)
    except UnsafeLayout as exc:
        record = fail(f"refusing to start: {exc}", 1)
    if isinstance(record, int):
        if demo_key_id is not None:  # never shown: it must not stay a live key nobody holds
            with KeyStore.in_state_dir(state) as keys:
                keys.revoke(demo_key_id)
        return record
    _report(args, record, state, admin_key, demo_key)
    if args.detach:
        return 0
    return _wait_then_down(args, record, state)


def _prepare_shared_state(state: Path) -> str | None:
    """Refuse an unsafe layout, then migrate every store's schema; the problem, or None."""
    from switchyard.db.engine import database_errors
    from switchyard.db.location import UnsafeLayout, check_layout
    from switchyard.db.migrations import SchemaError
    from switchyard.db.schemas import migrate_stores

    try:
        check_layout(state, hosts=1)  # the cluster's other hosts: checked when attaching, and by each replica
        migrate_stores(state)
    except UnsafeLayout as exc:
        return f"refusing to start: {exc}"
    except database_errors(ValueError, SchemaError) as exc:
        return f"cannot prepare the shared state: {exc}"
    return None


def _start_local(args: argparse.Namespace, state: Path, policies: Path) -> PlatformRecord | int:
    from switchyard.cluster.head import failure_path
    from switchyard.cluster.supervisor import HEAD_MODULE

    logs = state / "logs"
    logs.mkdir(exist_ok=True)
    log_file = (logs / "head.log").open("ab")
    log_start = log_file.tell()  # the log is appended to across runs: this run's part starts here
    failure = failure_path(state)
    failure.unlink(missing_ok=True)  # a past run's
    cmd = [
        sys.executable,
        "-m",
        HEAD_MODULE,
        "--state-dir",
        str(state),
        "--policies",
        str(policies),
        "--gpus",
        str(args.gpus),
        "--cpus",
        str(args.cpus),
        "--local-model-gpus",
        str(args.local_model_gpus),
        "--apps-ready-within",
        str(args.timeout),
    ] + (["--demo"] if args.demo else [])
    proc = subprocess.Popen(
        cmd, stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )  # survives this shell; `down` signals it
    # The head gives up on its own (and says why) once a part misses its deadline; this is the
    # backstop for a head stuck before that.
    give_up_after = HEAD_START_S + 4 * args.timeout  # four parts, each with its deadline
    deadline = time.monotonic() + give_up_after
    while time.monotonic() < deadline:
        record = read_record(state)
        if record is not None and record.supervisor_pid == proc.pid:
            return record
        if proc.poll() is not None:
            if failure.exists():  # the head said why it gave up
                return fail(f"{failure.read_text().rstrip()}\n(the head's whole log: {logs / 'head.log'})", 1)
            with (logs / "head.log").open("rb") as f:
                f.seek(log_start)
                excerpt = failure_excerpt(f.read().decode(errors="replace"))
            return fail(
                f"the platform head exited with code {proc.returncode}:\n{excerpt}\n"
                f"(the whole log, tracebacks included: {logs / 'head.log'})",
                1,
            )
        time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    return fail(f"the platform did not come up within {give_up_after:.0f}s; see {logs / 'head.log'}", 1)


def failure_excerpt(log: str, keep: int = 12) -> str:
    """The last lines of a failed head's log that say what went wrong, without the traceback
    frames around them (a user reads the error; the log file keeps the frames)."""
    return "\n".join(without_frames(log)[-keep:]) or "(the log says nothing more)"


def _attach(args: argparse.Namespace, state: Path, policies: Path) -> PlatformRecord | int:
    from switchyard.cluster.head import PLATFORM_ENV

    os.environ.update(PLATFORM_ENV)
    import ray

    from switchyard.cluster.actor_readiness import wait_for_actor
    from switchyard.cluster.deploy import (
        cluster_occupant,
        deploy_console,
        deploy_gateway,
        start_scheduler,
        undeploy,
    )
    from switchyard.cluster.occupant import attach_refusal
    from switchyard.cluster.placement import cluster_hosts
    from switchyard.cluster.record import NAMESPACE, write_record
    from switchyard.cluster.serve_configs import PLATFORM_APPS
    from switchyard.db.location import check_layout

    # The cluster's workers' logs are not this command's output.
    context = ray.init(address=args.address, namespace=NAMESPACE, log_to_driver=False)
    check_layout(state, cluster_hosts())  # UnsafeLayout: reported by `run`

    def refusal() -> str | None:
        return attach_refusal(state, cluster_occupant(args.timeout), PLATFORM_APPS)

    # Before anything is started: on refusal the cluster, and the platform on it, are left untouched.
    if (refused := refusal()) is not None:
        return fail(f"refusing to attach: {refused}", 1)
    dashboard_url = f"http://{context.dashboard_url}" if context.dashboard_url else None
    try:
        scheduler = start_scheduler(policies, state, dashboard_url)
        wait_for_actor("scheduler", scheduler.ping.remote, args.timeout)
        # Another `up` may have started its scheduler since the check (the name is claimed once).
        if (refused := refusal()) is not None:
            return fail(f"refusing to attach: {refused}", 1)
        gateway_url = deploy_gateway(
            policies, state, args.gateway_port, local_model_gpus=args.local_model_gpus, ready_within_s=args.timeout
        )
        console_url = deploy_console(policies, state, gateway_url, ready_within_s=args.timeout)
    except PlatformNotRunning as exc:
        # Someone else's cluster: take off what this `up` put on it, Serve itself aside (as `down` does).
        undeploy(shutdown_serve=False, policies_dir=policies, state_dir=state)
        return fail(f"{exc}\nswitchyard took off what it had started; the cluster is as it was", 1)
    record = PlatformRecord(
        ray_address=args.address,
        dashboard_url=dashboard_url,
        gateway_url=gateway_url,
        console_url=console_url,
        owns_cluster=False,
        policies_dir=str(policies),
        state_dir=str(state),
        gpus=int(ray.cluster_resources().get("GPU", 0)),
        demo=args.demo,
        started_at=time.time(),
    )
    write_record(state, record)
    return record


def _report(
    args: argparse.Namespace, record: PlatformRecord, state: Path, admin_key: str | None, demo_key: str | None
) -> None:
    out = {
        "gateway_url": record.gateway_url,
        "console_url": record.console_url,
        "dashboard_url": record.dashboard_url,
        "ray_address": record.ray_address,
        "state_dir": str(state),
        "owns_cluster": record.owns_cluster,
        "stop": f"switchyard down --state-dir {state}",
    }
    if demo_key:
        out["demo_api_key"] = demo_key
    if admin_key:
        out["admin_key_file"] = str(state / "admin.key")
    if args.json:
        print_json(out)
        return
    print("switchyard is up")
    print(f"  gateway    {record.gateway_url}  (OpenAI-compatible: {record.gateway_url}/v1)")
    print(f"  console    {record.console_url}  (sign in with a switchyard key)")
    print(f"  dashboard  {record.dashboard_url}")
    print(f"  ray        {record.ray_address}")
    if demo_key:
        print(f"  demo key   {demo_key}  (team 'demo'; shown once)")
    if admin_key:
        print(f"  admin key  written to {state / 'admin.key'} (mode 0600)")
    print(f"  stop with  switchyard down --state-dir {state}")


def _wait_then_down(args: argparse.Namespace, record: PlatformRecord, state: Path) -> int:
    from switchyard.cli.down import stop_platform

    print("running in the foreground; Ctrl-C stops it")
    try:
        while read_record(state) is not None:
            time.sleep(1)
    except KeyboardInterrupt:
        pass
    code = stop_platform(state)
    if code == 0:
        print(f"switchyard is down (state dir {state})")
    return code
