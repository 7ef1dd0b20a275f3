"""`switchyard budgets [--team T] [--json]`: budgets (limit, spent, reserved, reset) and spend by
team, flow, model and day, read from the ledger's store. Needs a key allowed to read spend:
a team admin sees its own team (the default), auditors and platform admins any or all."""

from __future__ import annotations

import argparse
from typing import Any

from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.report import spend_report
from switchyard.cli._args import utc_day
from switchyard.cli._auth import NotAuthenticated, add_auth_args, principal, require
from switchyard.cli._output import fail, print_json, print_table
from switchyard.cli._teams import unknown_team
from switchyard.db.engine import open_database
from switchyard.db.location import LEDGER_URL_ENV, ledger_url
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden
from switchyard.state import state_dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("budgets", help="budgets and spend by team, flow, model and day")
    parser.add_argument("--team", help="one team (default: your team if you are a team admin, else all)")
    parser.add_argument("--since", metavar="YYYY-MM-DD", type=utc_day, help="spend from this UTC day on")
    parser.add_argument("--ledger", help=f"ledger URL (default: ${LEDGER_URL_ENV}, else the state dir's ledger.db)")
    parser.add_argument("--json", action="store_true")
    add_auth_args(parser)
    parser.set_defaults(handler=run_budgets)


def run_budgets(args: argparse.Namespace) -> int:
    try:
        team = args.team
        if team is None and (who := principal(args)).role is Role.TEAM_ADMIN:
            team = who.team
        require(args, Action.READ_SPEND, team)
    except (NotAuthenticated, Forbidden) as exc:
        return fail(str(exc), 3)
    url = ledger_url(state_dir(args.state_dir), args.ledger)
    try:
        db = open_database(url)
    except ValueError as exc:
        return fail(str(exc))
    try:
        report = spend_report(BudgetLedger(db), team, args.since)
    finally:
        db.close()
    if args.team is not None and not report["budgets"] and not report["spend"]:
        # Nothing for it: a typo (it read as a team that spent $0), unless the platform serves it.
        problem = unknown_team(args.team, state_dir(args.state_dir))
        if problem is not None:
            return fail(f"{problem}; the ledger has nothing for it either")
    if args.json:
        print_json(report)
        return 0
    print_table(
        ["budget", "limit $", "spent $", "reserved $", "remaining $", "resets at"],
        [
            [
                b["budget"],
                f"{b['limit_usd']:.2f}",
                f"{b['spent_usd']:.4f}",
                f"{b['reserved_usd']:.4f}",
                f"{b['remaining_usd']:.4f}",
                b["resets_at"],
            ]
            for b in report["budgets"]
        ],
    )
    print()
    print_table(
        ["day", "team", "flow", "model", "spent $", "requests", "tokens in", "tokens out"],
        [
            [
                r["day"],
                r["team"],
                r["flow"],
                r["model"],
                f"{r['usd']:.4f}",
                r["requests"],
                r["prompt_tokens"],
                r["completion_tokens"],
            ]
            for r in report["spend"]
        ],
    )
    print(f"\ntotal: ${report['total_usd']:.4f}")
    return 0
