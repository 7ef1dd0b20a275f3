"""`switchyard policy check|explain`: validate a policy directory; show a flow's effective policy.

Both read files only (no key needed): `check` is the linter a policy change runs in review.
"""

from __future__ import annotations

import argparse
from typing import Any

from switchyard.budgets.resolve import flow_limits
from switchyard.cli._output import fail, print_json, print_table
from switchyard.paths import policies_dir
from switchyard.policy.errors import PolicyError
from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("policy", help="check and explain policies")
    sub = parser.add_subparsers(dest="policy_command", required=True)
    check = sub.add_parser("check", help="list every violation in a policy directory; non-zero exit if any")
    check.add_argument("directory", nargs="?", help="policy directory (default: the repo's policies/)")
    check.add_argument("--json", action="store_true")
    check.set_defaults(handler=run_check)
    explain = sub.add_parser("explain", help="the effective policy of a flow and which file set each field")
    explain.add_argument("--team", required=True)
    explain.add_argument("--flow", help="default: the team's default flow")
    explain.add_argument("--policies", help="policy directory (default: the repo's policies/)")
    explain.add_argument("--json", action="store_true")
    explain.set_defaults(handler=run_explain)


def run_check(args: argparse.Namespace) -> int:
    root = policies_dir(args.directory)
    try:
        ps = load_policy_set(root)
    except PolicyError as exc:
        if args.json:
            print_json({"ok": False, "violations": [v.__dict__ for v in exc.violations]})
        else:
            print(f"{root}: {len(exc.violations)} violation(s)")
            for v in exc.violations:
                print(f"  {v}")
        return 1
    summary = {
        "ok": True,
        "root": str(root),
        "teams": len(ps.teams),
        "flows": sum(len(t.flows) for t in ps.teams.values()),
        "prompts": len(ps.prompts),
        "fingerprint": ps.fingerprint,
    }
    if args.json:
        print_json(summary)
    else:
        print(
            f"{root}: ok ({summary['teams']} teams, {summary['flows']} flows, "
            f"{summary['prompts']} prompts; fingerprint {ps.fingerprint[:12]})"
        )
    return 0


def run_explain(args: argparse.Namespace) -> int:
    try:
        ps = load_policy_set(policies_dir(args.policies))
    except PolicyError as exc:
        return fail(str(exc), 1)
    team = ps.teams.get(args.team)
    if team is None:
        return fail(f"unknown team {args.team!r} (teams: {', '.join(sorted(ps.teams))})")
    flow = args.flow or team.default_flow
    if flow is None or flow not in team.flows:
        return fail(f"team {args.team!r} has no flow {flow!r} (flows: {', '.join(sorted(team.flows))})")
    resolved = resolve_flow(ps, args.team, flow)
    assert not isinstance(resolved, list), "a loaded policy set resolves every flow"
    values = resolved.policy.model_dump(mode="json")
    # The budget the ledger holds the flow to: limits it leaves out are its team's, whose own
    # are the org guardrail's max where the team file leaves them out.
    values["budget"] = flow_limits(ps, args.team, resolved.policy.budget).model_dump(mode="json")
    provenance = dict(resolved.provenance)
    set_by = provenance.get("budget")
    inherited = "the team's effective budget (teams/<t>.yaml: budget, else org.yaml guardrails max)"
    provenance["budget"] = f"{set_by}; unset periods: {inherited}" if set_by else inherited
    if args.json:
        print_json({"policy": values, "set_by": provenance})
        return 0
    rows = [(k, _short(values[k]), provenance.get(k, "(built-in default)")) for k in values]
    print_table(["field", "value", "set by"], rows)
    return 0


def _short(value: Any, limit: int = 60) -> str:
    text = str(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
