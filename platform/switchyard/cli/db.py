"""`switchyard db migrate|status`: the shared stores' schemas.

`switchyard up` migrates by itself; `db migrate` is for an upgrade of a running deployment
(migrate, then roll the replicas: a replica refuses a database that is behind or ahead of its
code). `db status` shows which database each store uses and its schema version.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, TypeVar

from switchyard.cli._output import fail, print_json, print_table
from switchyard.state import state_dir

T = TypeVar("T")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("db", help="the shared stores' database: migrate, show schema versions")
    sub = parser.add_subparsers(dest="db_command", required=True)
    for name, handler, text in (
        ("migrate", run_migrate, "apply every store's pending schema migrations"),
        ("status", run_status, "which database each store uses and its schema version"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("--state-dir", help="state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
        p.add_argument("--json", action="store_true")
        p.set_defaults(handler=handler)


def run_migrate(args: argparse.Namespace) -> int:
    from switchyard.db.schemas import migrate_stores

    applied = _on_the_database(lambda: migrate_stores(state_dir(args.state_dir)), "cannot migrate")
    if isinstance(applied, int):
        return applied
    if args.json:
        print_json({"applied": applied})
    else:
        for store, count in applied.items():
            print(f"{store}: {count} migration(s) applied" if count else f"{store}: up to date")
    return 0


def run_status(args: argparse.Namespace) -> int:
    from switchyard.db.schemas import store_versions

    rows = _on_the_database(lambda: store_versions(state_dir(args.state_dir)), "cannot read the schema versions")
    if isinstance(rows, int):
        return rows
    if args.json:
        print_json(rows)
    else:
        columns = ["store", "database", "version", "code_version", "state"]
        print_table(columns, [[r[c] for c in columns] for r in rows])
    return 0 if all(r["state"] == "ok" for r in rows) else 1


def _on_the_database(work: Callable[[], T], doing: str) -> T | int:
    """`work`'s result, or the exit code after one clear line when the database cannot answer."""
    from switchyard.db.engine import database_errors

    try:
        return work()
    except database_errors(ValueError) as exc:
        return fail(f"{doing}: {exc}", 1)
