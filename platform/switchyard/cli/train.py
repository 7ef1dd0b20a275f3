"""`switchyard train ...`: run a training job from a job spec.

`train run CONFIG` runs it on this machine (N local processes, or a private local Ray with
`--ray`); `train plot RUN` draws a run's metrics file. `train submit | list | cancel` (in
`_train_queue.py`) go through the scheduler.
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from switchyard.cli._args import int_between
from switchyard.cli._output import fail

if TYPE_CHECKING:  # the CLI imports torch and Ray only for the command that needs them
    from switchyard.train.loop import TrainResult
    from switchyard.train.spec import JobSpec

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job stopped on a notice and can be resumed


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("train", help="training jobs (Ray Train, FSDP, ZeRO)")
    commands = parser.add_subparsers(dest="train_command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a job spec on this machine and print its result")
    run.add_argument("config", help="job spec YAML (see train_jobs/configs/)")
    run.add_argument(
        "--nproc", type=int_between(1, 1_024), default=None, help="local processes (default: the spec's num_workers)"
    )
    run.add_argument("--ray", action="store_true", help="run under Ray Train on a private local Ray instead")
    run.add_argument("--storage", default=None, help="checkpoint root (local dir or s3://)")
    run.add_argument("--job-id", default=None, help="id preemption notices address")
    run.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="write torch.profiler traces to DIR; print collective vs compute time",
    )
    run.set_defaults(handler=run_command)
    plot = commands.add_parser("plot", help="draw a run's loss and tokens/s against step as a PNG")
    plot.add_argument(
        "run",
        metavar="RUN",
        help="a run directory (<checkpoint.uri>/<job name>), its metrics.jsonl, or a job name "
        "(looked up under the state dir's train/checkpoints and train/runs)",
    )
    plot.add_argument("--out", default=None, metavar="PATH", help="PNG to write (default: <run dir>/metrics.png)")
    plot.add_argument("--team", default=None, help="the team a platform job ran for (its runs are under the team's)")
    plot.add_argument("--state-dir", help="platform state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")
    plot.set_defaults(handler=plot_command)
    from switchyard.cli._train_queue import add_commands

    add_commands(commands)


def run_command(args: argparse.Namespace) -> int:
    from switchyard.train.job_errors import JobInputError
    from switchyard.train.spec import JobSpecError, load_job_spec
    from switchyard.train.step_sync import NonFiniteLossError

    try:
        spec = load_job_spec(args.config)
    except JobSpecError as exc:
        return fail(str(exc))
    if args.nproc is not None and args.nproc < 1:
        return fail(f"--nproc must be at least 1, got {args.nproc}")
    if args.storage:
        spec = spec.with_changes(**{"checkpoint.uri": args.storage})
    if args.ray and args.profile:
        return fail("--profile is supported for local runs only (drop --ray)")
    try:
        result = _run_on_ray(spec, args) if args.ray else _run_local(spec, args)
    except NonFiniteLossError as exc:
        return fail(str(exc), 1)
    except JobInputError as exc:
        return fail(str(exc))
    print(result.to_json(), flush=True)
    return EXIT_PREEMPTED if result.resumable else 0


def _run_on_ray(spec: JobSpec, args: argparse.Namespace) -> TrainResult:
    import ray

    from switchyard.train.ray_trainer import run_on_ray

    ray.init(address="local", include_dashboard=False)
    try:
        return run_on_ray(spec, job_id=args.job_id)
    finally:
        ray.shutdown()


def _run_local(spec: JobSpec, args: argparse.Namespace) -> TrainResult:
    from switchyard.train.launch import run_local

    return run_local(spec, nproc=args.nproc, job_id=args.job_id, profile_dir=args.profile)


def plot_command(args: argparse.Namespace) -> int:
    from pathlib import Path

    from switchyard.state import state_dir
    from switchyard.train.metrics_log import MetricsFileError, find_metrics_file, read_metrics
    from switchyard.train.metrics_plot import plot_metrics

    metrics = find_metrics_file(args.run, state_dir(args.state_dir), args.team)
    try:
        read = read_metrics(metrics)
    except MetricsFileError as exc:
        return fail(str(exc))
    if read.skipped:
        shown = "; ".join(read.skipped[:3]) + ("; ..." if len(read.skipped) > 3 else "")
        print(f"switchyard: {metrics}: {len(read.skipped)} line(s) skipped: {shown}", file=sys.stderr)
    rows = read.rows
    out = Path(args.out) if args.out else metrics.parent / "metrics.png"
    plot_metrics(rows, out, title=f"{metrics.parent.name}: steps {rows[0]['step']}-{rows[-1]['step']}")
    print(out)
    return 0
