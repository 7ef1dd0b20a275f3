"""Entry point for a training job: `python -m train_jobs.run CONFIG`.

With Ray (the default): `ray job submit -- python -m train_jobs.run CONFIG` runs it with
`TorchTrainer` on the cluster (a local Ray is started when none is running). With
`--local N` it runs N plain torch.distributed processes on this machine, no Ray.

The last line on stdout is one JSON object: job, status (`completed` | `preempted`),
step, loss, checkpoint, resumable, resumed_from, reason, and the last logged metrics
(tokens_per_s, step_time_s, mfu, grad_norm, memory_bytes, memory_kind, metrics_file).
Exit code 0 when completed, 75 (EX_TEMPFAIL) when preempted and resumable, 2 for a bad
config or data, or checkpoints none of which can be resumed (one line naming the file), 1 when
the loss became non-finite (the error names the step and the last good checkpoint).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from switchyard.train.loop import TrainResult
from switchyard.train.spec import JobSpec, JobSpecError, load_job_spec

EXIT_PREEMPTED = 75


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m train_jobs.run", description=__doc__.split("\n")[0])
    parser.add_argument("config", help="job spec YAML (see train_jobs/configs/)")
    parser.add_argument("--local", type=int, metavar="N", default=None, help="run N local processes without Ray")
    parser.add_argument(
        "--storage", default=None, help="checkpoint storage root (local dir or s3://); default from the spec"
    )
    parser.add_argument("--job-id", default=None, help="id preemption notices are addressed to (default: the job name)")
    parser.add_argument(
        "--team",
        default=os.environ.get("SWITCHYARD_TEAM"),
        help="the team whose GPU quota the job uses (default: $SWITCHYARD_TEAM)",
    )
    parser.add_argument("--priority", default="training", help="priority class in policies/scheduler.yaml")
    parser.add_argument(
        "--profile",
        default=None,
        metavar="DIR",
        help="write a torch.profiler trace to DIR and print collective vs compute time",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        spec = load_job_spec(args.config)
    except JobSpecError as exc:
        print(f"train_jobs.run: {exc}", file=sys.stderr)
        return 2
    if args.storage:
        spec = spec.with_changes(**{"checkpoint.uri": args.storage})
    from switchyard.train.job_errors import JobInputError
    from switchyard.train.step_sync import NonFiniteLossError

    if args.local is not None:
        from switchyard.train.launch import run_local

        try:
            result = run_local(spec, nproc=args.local, job_id=args.job_id, profile_dir=args.profile)
        except NonFiniteLossError as exc:
            print(f"train_jobs.run: {exc}", file=sys.stderr)
            return 1
        except JobInputError as exc:
            print(f"train_jobs.run: {exc}", file=sys.stderr)
            return 2
    else:
        import ray

        if args.profile:
            print("train_jobs.run: --profile runs with --local only", file=sys.stderr)
            return 2
        # Under `ray job submit` RAY_ADDRESS names the cluster; otherwise start a private
        # local one rather than attaching to whatever cluster happens to run on this node.
        ray.init(address=os.environ.get("RAY_ADDRESS") or "local")
        try:
            result = run_admitted(spec, args)
        except NonFiniteLossError as exc:  # the lease was released (finished) on the way out
            print(f"train_jobs.run: {exc}", file=sys.stderr)
            return 1
        except (JobInputError, ValueError, TimeoutError) as exc:  # a job input error released its lease too
            print(f"train_jobs.run: {exc}", file=sys.stderr)
            return 2
    print(result.to_json(), flush=True)
    return EXIT_PREEMPTED if result.resumable else 0


def run_admitted(spec: JobSpec, args: argparse.Namespace) -> TrainResult:
    """Ask the platform's scheduler for the job's GPUs (waiting in its queue), train on exactly
    the granted nodes, and give the GPUs back: finished, or preempted and requeued."""
    from switchyard.cluster.admission import NoScheduler, admit, launched_workload, training_submission
    from switchyard.train.ray_trainer import run_on_ray

    log = logging.getLogger(__name__)
    launched = launched_workload() is not None
    submission = None
    if not launched:
        if not args.team:
            raise ValueError("--team (or $SWITCHYARD_TEAM) is required: GPUs are granted against a team's quota")
        submission = training_submission(
            spec.name, spec.gpus, args.team, args.priority, gpus_per_worker=spec.gpus_per_worker
        )
    try:
        admission = admit(submission)
    except NoScheduler as exc:
        log.warning("%s: running without admission (plain Ray cluster)", exc)
        return run_on_ray(spec, job_id=args.job_id, team=args.team)
    while True:
        finished = True  # a crash releases for good: requeueing a failing job would loop
        try:
            result = run_on_ray(
                spec,
                job_id=admission.workload_id,
                worker_label_selectors=admission.worker_label_selectors(spec.gpus_per_worker),
                workload_id=admission.workload_id,
                team=admission.grant.team,  # the team whose GPUs run it owns the run directory
            )
            finished = not result.resumable
        finally:
            requeued = admission.release(finished=finished)
        if not requeued or launched:
            return result  # a job the scheduler launched is launched again when readmitted
        # Started by hand: no one else would resume it. Wait in the queue, holding no GPUs,
        # and resume from the checkpoint just written when admitted again.
        log.info("preempted at step %d; waiting to be admitted again", result.step)
        admission = admit(None, workload_id=admission.workload_id)


if __name__ == "__main__":
    sys.exit(main())
