"""`switchyard train submit | list | cancel`: training jobs through the platform's scheduler.

Added to the `train` command group (registered by `cli/train.py`). `submit` queues the job;
on admission the scheduler launches it through the Ray Jobs API (it shows in the dashboard's
Jobs tab), pinned to the GPUs it chose.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from switchyard.cli._auth import NotAuthenticated, add_auth_args, require
from switchyard.cli._output import fail, print_json, print_table
from switchyard.policy.roles import Action, Forbidden
from switchyard.state import STATE_DIR_ENV, state_dir

if TYPE_CHECKING:
    from switchyard.cluster.scheduler_client import SchedulerClient


def add_commands(commands: Any) -> None:
    submit = commands.add_parser("submit", help="queue a job spec with the scheduler")
    submit.add_argument("config", help="job spec YAML (see train_jobs/configs/)")
    submit.add_argument("--team", required=True, help="the team whose GPU quota the job uses")
    submit.add_argument("--priority", default="training", help="priority class (policies/scheduler.yaml)")
    submit.set_defaults(handler=submit_command)
    lst = commands.add_parser("list", help="queued and running workloads")
    lst.add_argument("--team")
    lst.set_defaults(handler=list_command)
    cancel = commands.add_parser("cancel", help="withdraw a queued workload or stop a running one")
    cancel.add_argument("workload_id")
    cancel.set_defaults(handler=cancel_command)
    for p in (submit, lst, cancel):
        add_auth_args(p)
        p.add_argument("--json", action="store_true")


@contextmanager
def _scheduler(args: argparse.Namespace) -> Iterator[SchedulerClient]:
    from switchyard.cli._ray import attached_platform
    from switchyard.cluster.record import read_record

    state = state_dir(args.state_dir)
    record = read_record(state)
    if record is None:
        raise LookupError("no platform is up (start one with `switchyard up`)")
    with attached_platform(state, record):  # NotRunning is a LookupError: the command fails naming why
        from switchyard.cluster.scheduler_client import platform_scheduler  # imports ray

        yield platform_scheduler()


def _guarded(fn: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            code: int = fn(args)
        except (NotAuthenticated, Forbidden) as exc:
            return fail(str(exc), 3)
        except LookupError as exc:
            return fail(str(exc))
        return code

    return wrapper


@_guarded
def submit_command(args: argparse.Namespace) -> int:
    import ray

    from switchyard.cluster.admission import training_submission
    from switchyard.train.spec import JobSpecError, load_job_spec

    require(args, Action.CALL_GATEWAY, args.team)  # a member of the team may spend its GPU quota
    config = Path(args.config).resolve()
    try:
        spec = load_job_spec(config)
    except JobSpecError as exc:
        return fail(str(exc))
    entrypoint = f"{sys.executable} -m train_jobs.run {config} --team {args.team} --priority {args.priority}"
    submission = training_submission(
        spec.name, spec.gpus, args.team, args.priority, entrypoint=entrypoint, gpus_per_worker=spec.gpus_per_worker
    ).model_copy(
        # The job's default checkpoint root is this platform's state dir, where the local model looks.
        update={"runtime_env": {"env_vars": {STATE_DIR_ENV: str(state_dir(args.state_dir))}}}
    )
    with _scheduler(args) as scheduler:
        try:
            workload_id = scheduler.submit(submission)
        except ray.exceptions.RayTaskError as exc:
            return fail(f"the scheduler refused the job: {exc.cause}")
    out = {"workload_id": workload_id, "team": args.team, "gpus": spec.gpus, "bundles": submission.bundles}
    if args.json:
        print_json(out)
    else:
        print(
            f"queued {spec.name} as {workload_id} ({spec.gpus} GPUs for team {args.team!r}); "
            "it starts as a Ray job when admitted: `switchyard train list`"
        )
    return 0


@_guarded
def list_command(args: argparse.Namespace) -> int:
    require(args, Action.VIEW_TEAM, args.team)  # the team's members (or auditors, operators) see its queue
    with _scheduler(args) as scheduler:
        rows = scheduler.list_workloads()
    rows = [r for r in rows if args.team is None or r["team"] == args.team]
    if args.json:
        print_json(rows)
    else:
        print_table(
            LIST_COLUMNS,
            [
                (
                    r["workload_id"],
                    r["team"],
                    r["priority_class"],
                    r["gpus"],
                    r["state"],
                    r["attempt"],
                    "-" if r["waited_s"] is None else duration(r["waited_s"]),
                    r["queue_position"] or "-",
                    r["ray_job"] or "-",
                    r["waiting_for"] or "-",
                )
                for r in rows
            ],
        )
    return 0


LIST_COLUMNS = ("workload", "team", "priority", "gpus", "state", "attempt", "waited", "position", "ray job", "why")


def duration(seconds: float) -> str:
    """A wait as people read it: 42s, 17m, 5.2h, 3.1d."""
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


@_guarded
def cancel_command(args: argparse.Namespace) -> int:
    with _scheduler(args) as scheduler:
        rows = {r["workload_id"]: r for r in scheduler.list_workloads()}
        if args.workload_id not in rows:
            return fail(f"unknown workload {args.workload_id!r}")
        require(args, Action.CALL_GATEWAY, rows[args.workload_id]["team"])
        scheduler.cancel(args.workload_id)
    if args.json:
        print_json({"cancelled": args.workload_id})
    else:
        print(f"cancelled {args.workload_id}")
    return 0
