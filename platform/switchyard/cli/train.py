"""`switchyard train ...`: run a training job from a job spec.

`train run CONFIG` runs it on this machine (N local processes, or a private local Ray with
`--ray`). `train submit | list | cancel` (in `_train_queue.py`) go through the scheduler.
"""

from __future__ import annotations

import argparse
from typing import Any

from switchyard.cli._output import fail

EXIT_PREEMPTED = 75  # EX_TEMPFAIL: the job stopped on a notice and can be resumed


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("train", help="training jobs (Ray Train, FSDP, ZeRO)")
    commands = parser.add_subparsers(dest="train_command", required=True, metavar="COMMAND")
    run = commands.add_parser("run", help="run a job spec on this machine and print its result")
    run.add_argument("config", help="job spec YAML (see train_jobs/configs/)")
    run.add_argument("--nproc", type=int, default=None, help="local processes (default: the spec's num_workers)")
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
    from switchyard.cli._train_queue import add_commands

    add_commands(commands)


def run_command(args: argparse.Namespace) -> int:
    from switchyard.train.spec import JobSpecError, load_job_spec

    try:
        spec = load_job_spec(args.config)
    except JobSpecError as exc:
        return fail(str(exc))
    if args.nproc is not None and args.nproc < 1:
        return fail(f"--nproc must be at least 1, got {args.nproc}")
    if args.storage:
        spec = spec.with_changes(**{"checkpoint.uri": args.storage})
    if args.ray:
        if args.profile:
            return fail("--profile is supported for local runs only (drop --ray)")
        import ray

        from switchyard.train.ray_trainer import run_on_ray

        ray.init(address="local", include_dashboard=False)
        try:
            result = run_on_ray(spec, job_id=args.job_id)
        finally:
            ray.shutdown()
    else:
        from switchyard.train.launch import run_local

        result = run_local(spec, nproc=args.nproc, job_id=args.job_id, profile_dir=args.profile)
    print(result.to_json(), flush=True)
    return EXIT_PREEMPTED if result.resumable else 0
