"""The `switchyard` command.

Each command group is one module in this package exposing `register(subparsers)`; the
parser is assembled from every such module, so adding a command never edits this file.
A handler returns the process exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import pkgutil
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchyard",
        description="An internal AI platform on one Ray cluster: gateway, training, GPU scheduler.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # Before anything imports ray, which reads its auth mode once, at import: a command typed in
    # a fresh shell talks to the platform's cluster with the platform's settings (token auth on).
    from switchyard.cli._output import fail
    from switchyard.cluster.head import PLATFORM_ENV
    from switchyard.cluster.record import RecordUnreadable
    from switchyard.db.engine import DatabaseUnavailable

    os.environ.update(PLATFORM_ENV)
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.handler(args)
    except (RecordUnreadable, DatabaseUnavailable) as exc:  # what many commands open: named, not a traceback
        return fail(str(exc))
    return code


if __name__ == "__main__":
    sys.exit(main())
