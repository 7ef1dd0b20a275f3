"""`switchyard env`: the shell settings that point Ray's own tools at the running platform.

    eval "$(switchyard env)"
    ray job submit -- python -m train_jobs.run train_jobs/configs/zero2.yaml --team research

Ray's CLI reads `RAY_AUTH_MODE` and `RAY_ADDRESS` from the shell: without them a new shell's
`ray job submit` finds no cluster, or is refused by the platform's token authentication.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from switchyard.cli._output import fail, print_json
from switchyard.cluster.head import PLATFORM_ENV
from switchyard.cluster.record import read_record
from switchyard.cluster.record_liveness import not_running, stale_record_message
from switchyard.state import STATE_DIR_ENV, state_dir


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("env", help="shell exports for Ray's CLI (`eval \"$(switchyard env)\"`)")
    p.add_argument("--state-dir", help="state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    state = state_dir(args.state_dir)
    record = read_record(state)
    if record is None:
        return fail(f"no platform is up for state dir {state} (start one with `switchyard up`)")
    why = not_running(state, record)
    if why is not None:  # its dashboard address would send `ray job submit` to a cluster that is gone
        return fail(stale_record_message(state, why))
    if record.dashboard_url is None:
        return fail("the platform runs without a dashboard, so Ray's job CLI cannot reach it")
    exports = {
        "RAY_ADDRESS": record.dashboard_url,  # `ray job submit|list|logs` talk to the dashboard
        "RAY_AUTH_MODE": PLATFORM_ENV["RAY_AUTH_MODE"],  # the token itself stays in Ray's token file
        STATE_DIR_ENV: str(state),
    }
    if args.json:
        print_json(exports)
    else:
        for name, value in exports.items():
            print(f"export {name}={shlex.quote(value)}")
    return 0
