"""`switchyard status`: the whole platform on one screen."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from switchyard.cli._auth import NotAuthenticated, operator_key
from switchyard.cli._output import fail, print_json, print_table
from switchyard.cluster.record import read_record
from switchyard.state import state_dir


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("status", help="nodes, GPU division, Serve apps, queues, policy state")
    p.add_argument("--state-dir", help="state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
    p.add_argument("--api-key", help="operator key (default: $SWITCHYARD_API_KEY, then the state dir's admin key)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    state = state_dir(args.state_dir)
    record = read_record(state)
    if record is None:
        return fail(f"no platform is up for state dir {state} (start one with `switchyard up`)")
    from switchyard.cli._ray import NotRunning, attached_platform

    try:
        with attached_platform(state, record):
            from switchyard.cluster.status import collect  # imports ray

            info = collect(record, operator_key(state, args.api_key))
    except NotRunning as exc:
        return fail(str(exc))
    except NotAuthenticated as exc:  # a damaged admin.key: named, as every other command names it
        return fail(str(exc), 3)
    if args.json:
        print_json(info)
    else:
        render(info)
    return 0


def render(info: dict[str, Any]) -> None:
    g = info["gpus"]
    print(f"gateway {info['gateway_url']}   console {info['console_url']}   dashboard {info['dashboard_url']}")
    print(f"ray {info['ray_address']}")
    if g["serve"] is None:
        print(f"\nGPUs: {g['total']:.0f} total, {g['free']:.0f} free ({g['error']})\n")
    else:
        division = f"{g['serve']:.0f} serve + {g['train']:.0f} train + {g['free']:.0f} free"
        print(f"\nGPUs: {g['total']:.0f} total = {division}\n")
    print_table(
        ["node", "group", "gpus", "cpus"],
        [(n["node_id"], n["node_group"], n["gpus"], n["cpus"]) for n in info["nodes"]],
    )
    print("\nServe applications")
    rows = [
        (app, d, dep["status"], dep["replicas"])
        for app, a in info["serve"].items()
        for d, dep in a["deployments"].items()
    ]
    print_table(["app", "deployment", "status", "replicas"], rows)
    sched = info["scheduler"]
    print("\nScheduler")
    if "error" in sched:
        print(f"  {sched['error']}")
    else:
        print_table(
            ["team", "guaranteed", "used", "borrowed", "queued", "oldest wait s"],
            [
                (
                    t["team"],
                    t["guaranteed_gpus"],
                    t["used_gpus"],
                    t["borrowed_gpus"],
                    t["queued"],
                    round(t["oldest_wait_s"], 1),
                )
                for t in sched["teams"]
            ],
        )
        print(f"  leases: {len(sched['leases'])}   pending: {len(sched['pending'])}")
        if sched.get("jobs_api_backlog"):  # launches and stops waiting on a slow dashboard
            print(f"  Jobs API calls waiting: {sched['jobs_api_backlog']} (the Ray dashboard is slow to answer)")
        render_cordoned(sched.get("cordoned_nodes", []))
        render_waits(sched.get("waits", {}))
        render_fairness(sched.get("fairness"))
    gw = info["gateway"]
    print("\nGateway / policy")
    if gw.get("ok"):
        pol = gw.get("policy", {})
        keys = pol.get("keys", {})
        print(
            f"  policy {str(pol.get('fingerprint', ''))[:12]} ({pol.get('state', '?')})  "
            f"teams {len(pol.get('teams', []))}  last error: {pol.get('last_error') or 'none'}"
        )
        print(f"  keys ({keys.get('state', '?')})  last error: {keys.get('last_error') or 'none'}")
    else:
        print(f"  {gw.get('error')}")
    render_policy(info.get("policy", {}))


def render_cordoned(rows: list[dict[str, Any]]) -> None:
    """Nodes an operator took out of scheduling, and what still runs there (`switchyard nodes`)."""
    for r in rows:
        running = ", ".join(lease["workload_id"] for lease in r["leases"]) or "nothing"
        print(f"  node {r['node_id'][:12]} {r['state']}{'' if r['alive'] else ' (gone)'}: {running} runs there")


def render_waits(waits: dict[str, Any]) -> None:
    """Per team: p50 / p90 / max queue wait over the last hour and day (admitted + still waiting)."""
    from switchyard.cli._train_queue import duration

    if not waits:
        return
    print("\n  queue wait (admitted in the window, or still waiting)")
    rows = []
    for team, windows in waits.items():
        cells: list[Any] = [team]
        for name in ("1h", "1d"):
            w = windows[name]
            cells.append(f"{duration(w['p50'])} / {duration(w['p90'])} / {duration(w['max'])} (n={w['n']:.0f})")
        rows.append(cells)
    print_table(["team", "last hour p50 / p90 / max", "last day p50 / p90 / max"], rows)


def render_fairness(fairness: dict[str, Any] | None) -> None:
    """Per team: GPU-seconds received / max-min fair share in the last full hour and day, and
    GPU-hours queued behind lower priorities (the simulator's definitions, docs/scheduler.md)."""
    if not fairness:
        return

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    since = fairness["since"]
    counted = "" if since is None else f" since {datetime.fromtimestamp(since, UTC):%Y-%m-%d %H:%M} UTC"
    print(
        f"\n  fair share (received / fair GPU-s; Jain's index last hour: {ratio(fairness['jain_1h'])}); "
        f"inversion and quota wait past {fairness['inversion_bound_s']:.0f} s, GPU-h over the last day "
        f"(and in all{counted})"
    )

    def gpu_h(row: dict[str, Any], key: str) -> str:
        day = row.get(f"{key}_1d")  # a scheduler from before the last-day sums has totals only
        total = f"{row[key] / 3600:.1f}"
        return total if day is None else f"{day / 3600:.1f} ({total})"

    rows = [
        (
            team,
            ratio(row["share_ratio_1h"]),
            ratio(row["share_ratio_1d"]),
            gpu_h(row, "inversion_gpu_s"),
            gpu_h(row, "quota_wait_gpu_s"),
        )
        for team, row in fairness["teams"].items()
    ]
    print_table(["team", "share last hour", "share last day", "inversion GPU-h", "quota wait GPU-h"], rows)


def render_policy(pol: dict[str, Any]) -> None:
    print("\nPolicy set served by each gateway replica")
    if "error" in pol:
        print(f"  {pol['error']}")
        return
    published = str(pol.get("published", ""))
    print(
        f"  published {published[:12]} ({pol.get('state', '?')})  rejected changes {pol.get('rejected_changes', 0)}"
        f"  last error: {pol.get('last_error') or 'none'}"
    )
    replicas = pol.get("replicas", [])
    if not replicas:
        print("  no replica has asked for it yet")
        return
    print_table(
        ["replica", "node", "fingerprint", "state", "seen s ago"],
        [
            (
                r["replica"],
                str(r["node"])[:12],
                str(r["fingerprint"] or "")[:12] + ("" if r["fingerprint"] == published else "  (stale)"),
                r["state"],
                r["seen_s_ago"],
            )
            for r in replicas
        ],
    )
