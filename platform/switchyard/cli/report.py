"""`switchyard report --since 7d --out report.html`: the console's charts in one offline page,
for a weekly review (every team's traffic and spend, and the GPU split while a platform is up)."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from switchyard.cli._auth import NotAuthenticated, add_auth_args, require
from switchyard.cli._output import fail, print_json
from switchyard.policy.roles import Action, Forbidden
from switchyard.state import state_dir


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("report", help="write the console's charts to one offline HTML page")
    p.add_argument("--since", default="7d", help="window start: an age like 24h or 7d, unix seconds or ISO 8601")
    p.add_argument("--out", default="report.html", help="the HTML file to write (default report.html)")
    p.add_argument("--policies", help="policy directory (default: the running platform's, else the repo's)")
    p.add_argument("--json", action="store_true", help="print the figures as JSON as well")
    add_auth_args(p)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from switchyard.audit.query import parse_since
    from switchyard.cluster.record import read_record
    from switchyard.paths import policies_dir

    try:
        require(args, Action.OPERATE)
    except (NotAuthenticated, Forbidden) as exc:
        return fail(str(exc), 3)
    now = time.time()
    try:
        since = parse_since(args.since, now)
    except ValueError as exc:
        return fail(f"--since: {exc}")
    state = state_dir(args.state_dir)
    record = read_record(state)
    policies = Path(args.policies) if args.policies else Path(record.policies_dir) if record else policies_dir()
    if record is None:  # the databases alone: no live scheduler figures
        return _write(args, state, policies, None, since, now)
    from switchyard.cli._ray import NotRunning, attached_platform

    try:
        with attached_platform(state, record):
            from switchyard.cluster.scheduler_client import RetryPolicy, platform_scheduler

            def scheduler() -> Any:
                try:
                    return platform_scheduler(RetryPolicy(call_timeout_s=30, deadline_s=30))
                except ValueError:
                    return None

            return _write(args, state, policies, scheduler, since, now)
    except NotRunning as exc:
        print(f"switchyard: reporting from the databases alone: {exc}", file=sys.stderr)
        return _write(args, state, policies, None, since, now)


def _write(args: argparse.Namespace, state: Path, policies: Path, scheduler: Any, since: float, now: float) -> int:
    from switchyard.console.sources import PlatformReader
    from switchyard.console.views import render_standalone, report

    reader = PlatformReader(state, policies, scheduler or (lambda: None))
    try:
        view = report(reader, since, now)
        html = render_standalone(view)
        out = Path(args.out)
        try:
            out.write_text(html, encoding="utf-8")
        except OSError as exc:  # a directory that is not there, a read-only disk
            return fail(f"cannot write the report to {out}: {exc.strerror or exc}")
        if args.json:
            print_json({"out": str(out), **view.data})
        else:
            print(f"wrote {out} ({len(html) // 1024} KiB): open it in a browser; it loads nothing from the network")
    finally:
        reader.close()
    return 0
