"""`switchyard demo`: the scripted end-to-end story on a fresh local cluster; ends by itself."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from switchyard.cli._output import fail, print_json


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("demo", help="run the end-to-end demo on a fresh local cluster")
    p.add_argument("--keep", action="store_true", help="leave the platform running at the end")
    p.add_argument("--json", action="store_true", help="print one JSON object at the end")
    p.add_argument("--state-dir", help="the platform's state directory (default: a new temporary one)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from switchyard.demo import run_demo

    # With --json, stdout carries exactly one JSON object: whatever else reaches file
    # descriptor 1 while the demo runs (Ray's driver prints raylet warnings there) goes to stderr.
    saved = os.dup(1) if args.json else None
    if saved is not None:
        sys.stdout.flush()
        os.dup2(2, 1)
    try:
        report = run_demo(
            keep=args.keep,
            say=(lambda _msg: None) if args.json else print,
            state=Path(args.state_dir) if args.state_dir else None,
        )
    except RuntimeError as exc:
        return fail(f"the demo failed: {exc}", 1)
    finally:
        if saved is not None:
            sys.stdout.flush()
            os.dup2(saved, 1)
            os.close(saved)
    if args.json:
        print_json({"steps": report.steps, **report.summary})
    return 0
