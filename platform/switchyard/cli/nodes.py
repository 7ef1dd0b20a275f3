"""`switchyard nodes list | cordon | uncordon | drain`: operators take nodes out of scheduling.

Modelled on `kubectl cordon | uncordon | drain` (docs/operators.md, "Cordon and drain"): a
cordoned node takes no new lease and its leases run on; a drain cordons it and gives every
lease there that may move a preemption notice (checkpoint, release, requeue), and reports what
it cannot move (non-preemptible leases unless `--force`; Serve replicas) as blocking, exiting 1.
NODE is a node id or a prefix of one (`status` shows 12 characters). Platform operators only.
"""

from __future__ import annotations

import argparse
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from switchyard.cli._auth import add_auth_args, require
from switchyard.cli._output import fail, print_json, print_table
from switchyard.cli._train_queue import _guarded, _scheduler
from switchyard.policy.roles import Action

if TYPE_CHECKING:
    from switchyard.scheduler.driver.node_cordons import DrainReport

ID_SHOWN = 12  # as `status` shows node ids


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("nodes", help="GPU nodes: list, cordon, uncordon, drain")
    commands = parser.add_subparsers(dest="nodes_command", required=True, metavar="COMMAND")
    lst = commands.add_parser("list", help="each node's state (ready, cordoned, draining, drained) and its leases")
    lst.set_defaults(handler=list_command)
    cordon = commands.add_parser("cordon", help="no new lease on NODE; its leases run on")
    cordon.set_defaults(handler=cordon_command)
    uncordon = commands.add_parser("uncordon", help="let new leases onto NODE again")
    uncordon.set_defaults(handler=uncordon_command)
    drain = commands.add_parser("drain", help="cordon NODE and move what runs there (checkpoint, requeue)")
    drain.add_argument("--force", action="store_true", help="notice non-preemptible training leases too")
    drain.set_defaults(handler=drain_command)
    for p in (cordon, uncordon, drain):
        p.add_argument("node", metavar="NODE", help="a node id, or a prefix of one")
    for p in (lst, cordon, uncordon, drain):
        add_auth_args(p)
        p.add_argument("--json", action="store_true")


def _refused(exc: Exception) -> int:
    """The actor refused the call (an unknown or ambiguous node): its one-line reason."""
    cause = getattr(exc, "cause", None)
    return fail(str(cause if cause is not None else exc))


@_guarded
def list_command(args: argparse.Namespace) -> int:
    require(args, Action.OPERATE)
    with _scheduler(args) as scheduler:
        rows = scheduler.nodes()
    if args.json:
        print_json(rows)
        return 0
    print_table(
        ("node", "group", "gpus", "free", "state", "leases", "blocking the drain"),
        [
            (
                r["node_id"][:ID_SHOWN] + ("" if r["alive"] else " (gone)"),
                r["node_group"] or "-",
                r["gpus"],
                r["free_gpus"],
                r["state"],
                ", ".join(f"{lease['workload_id']} ({lease['gpus']})" for lease in r["leases"]) or "-",
                ", ".join(lease["workload_id"] for lease in r["leases"] if lease["blocks_drain"]) or "-",
            )
            for r in rows
        ],
    )
    return 0


@_guarded
def cordon_command(args: argparse.Namespace) -> int:
    return _cordon(args, "cordon")


@_guarded
def uncordon_command(args: argparse.Namespace) -> int:
    return _cordon(args, "uncordon")


def _cordon(args: argparse.Namespace, command: str) -> int:
    import ray

    require(args, Action.OPERATE)
    with _scheduler(args) as scheduler:
        try:
            node = scheduler.cordon(args.node) if command == "cordon" else scheduler.uncordon(args.node)
        except ray.exceptions.RayTaskError as exc:
            return _refused(exc)
    if args.json:
        print_json({"node": node, "cordoned": command == "cordon"})
    else:
        print(f"node {node[:ID_SHOWN]} {command}ed")
    return 0


@_guarded
def drain_command(args: argparse.Namespace) -> int:
    import ray

    require(args, Action.OPERATE)
    with _scheduler(args) as scheduler:
        try:
            report = scheduler.drain(args.node, force=args.force)
        except ray.exceptions.RayTaskError as exc:
            return _refused(exc)
    if args.json:
        print_json(asdict(report))
    else:
        _print_drain(report)
    if report.blocking:
        blockers = ", ".join(f"{b.workload_id} ({b.reason})" for b in report.blocking)
        return fail(f"node {report.node[:ID_SHOWN]} stays cordoned; the drain is blocked by {blockers}", 1)
    return 0


def _print_drain(report: DrainReport) -> None:
    node = report.node[:ID_SHOWN]
    print(f"node {node} cordoned")
    for workload in report.noticed:
        print(f"  {workload}: preemption notice sent (it checkpoints, releases and is requeued)")
    for workload in report.leaving:
        print(f"  {workload}: already under notice")
    if not (report.noticed or report.leaving or report.blocking):
        print("  nothing runs there: drained")
