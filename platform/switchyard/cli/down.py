"""`switchyard down`: stop exactly what `switchyard up` started. Never `ray stop`."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from switchyard.cli._output import fail, print_json
from switchyard.cli._ray import OCCUPANT_TIMEOUT_S
from switchyard.cluster.record import clear_record, read_record
from switchyard.cluster.record_liveness import cluster_silent
from switchyard.cluster.supervisor import look_up
from switchyard.state import state_dir

STOP_TIMEOUT_S = 90.0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("down", help="stop what `switchyard up` started")
    p.add_argument("--state-dir", help="state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    state = state_dir(args.state_dir)
    code = stop_platform(state)
    if code == 0:
        if args.json:
            print_json({"stopped": True, "state_dir": str(state)})
        else:
            print(f"switchyard is down (state dir {state})")
    return code


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def stop_platform(state: Path) -> int:
    record = read_record(state)
    if record is None:
        return fail(f"nothing to stop: no platform is recorded in {state}")
    if record.owns_cluster:
        pid = record.supervisor_pid
        assert pid is not None, "a platform that owns its cluster records its supervisor"
        supervisor = look_up(pid)
        if (elsewhere := supervisor.serves_another(state)) is not None:
            clear_record(state)  # a copied record: the platform it names is another state dir's
            return fail(
                f"the platform recorded in {state} is not running: its supervisor's PID {pid} is the supervisor "
                f"of another platform (state dir {elsewhere}), so switchyard left it alone and cleared this record",
                1,
            )
        if supervisor.serves(state):
            os.kill(pid, signal.SIGTERM)  # the supervisor undeploys and shuts its Ray down
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _alive(pid) and time.monotonic() < deadline:
                time.sleep(0.5)
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
                clear_record(state)
                return fail(
                    f"the supervisor {pid} did not stop in {STOP_TIMEOUT_S:.0f}s and was killed; "
                    f"Ray processes under {record.ray_temp_dir} may remain",
                    1,
                )
        else:  # it died without clearing its record (and the PID may be another process's now)
            print(
                f"switchyard: the supervisor recorded in {state} (PID {pid}) had already stopped; "
                f"Ray processes under {record.ray_temp_dir} may remain",
                file=sys.stderr,
            )
        clear_record(state)
    else:
        from switchyard.cluster.head import PLATFORM_ENV

        os.environ.update(PLATFORM_ENV)
        import ray

        from switchyard.cluster.deploy import cluster_occupant, stop_own_actors, undeploy
        from switchyard.cluster.occupant import another_platform
        from switchyard.cluster.record import NAMESPACE

        silent = cluster_silent(record)
        if silent is not None:  # ray.init would retry a cluster that is gone for minutes
            clear_record(state)
            return fail(
                f"nothing was stopped: {silent}. switchyard cleared the record in {state}; if the cluster comes "
                f"back with this platform on it, `switchyard up --address {record.ray_address} --state-dir {state}` "
                "attaches to it again and `switchyard down` then stops it",
                1,
            )
        # This state dir's platform: a record copied from another state dir names that one's.
        policies, platform_state = Path(record.policies_dir), state
        # The cluster's workers' logs (another platform's, a team's) are not this command's output.
        ray.init(address=record.ray_address, namespace=NAMESPACE, log_to_driver=False)
        other = another_platform(platform_state, cluster_occupant(OCCUPANT_TIMEOUT_S))
        if other is not None:  # a stale record: the apps and scheduler there are another platform's
            stop_own_actors(policies, platform_state)
            ray.shutdown()
            clear_record(state)
            return fail(
                f"the platform recorded in {state} no longer runs on {record.ray_address}: the scheduler and apps "
                f"there are another platform's (state dir {other}), so switchyard left them alone, stopped only "
                "this platform's own actors and cleared its record",
                1,
            )
        undeploy(shutdown_serve=False, policies_dir=policies, state_dir=platform_state)
        ray.shutdown()
        clear_record(state)
    return 0
