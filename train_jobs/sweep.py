"""A learning-rate x batch-size sweep of a job spec with Ray Tune:

    python -m train_jobs.sweep train_jobs/configs/ddp.yaml --lr 1e-3 3e-3 --batch-size 2 4
    ray job submit -- python -m train_jobs.sweep CONFIG --gpus-per-trial 2 --team research

Without `--gpus-per-trial` each trial trains on one CPU. With it, each trial asks the
platform's scheduler for its GPUs (against the team's quota, at `--priority`), waits in its
queue and releases them when done. Prints one JSON line per trial, best (lowest final loss) first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from switchyard.cli._args import int_between
from switchyard.train.spec import JobSpecError, load_job_spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train_jobs.sweep")
    parser.add_argument("config")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-3, 3e-3])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int_between(1, 10**9), default=None, help="override the spec's steps")
    parser.add_argument(
        "--gpus-per-trial", type=int, default=0, help="GPUs each trial leases from the scheduler (default: CPU trials)"
    )
    parser.add_argument("--team", default=os.environ.get("SWITCHYARD_TEAM"), help="the team whose GPU quota trials use")
    parser.add_argument("--priority", default="training", help="priority class in policies/scheduler.yaml")
    parser.add_argument(
        "--storage", default=None, help="Tune and checkpoint storage (shared or s3:// on a multi-node cluster)"
    )
    args = parser.parse_args(argv)
    if args.gpus_per_trial < 0:
        print(f"train_jobs.sweep: --gpus-per-trial must be 0 or more, got {args.gpus_per_trial}", file=sys.stderr)
        return 2
    if args.gpus_per_trial and not args.team:
        print("train_jobs.sweep: --team (or $SWITCHYARD_TEAM) is required with --gpus-per-trial", file=sys.stderr)
        return 2
    from switchyard.train.sweep import check_grid, run_sweep

    try:
        spec = load_job_spec(args.config)
        if args.steps is not None:
            spec = spec.with_changes(steps=args.steps)
        check_grid(spec, args.lr, args.batch_size, args.gpus_per_trial)
    except (JobSpecError, ValueError) as exc:
        print(f"train_jobs.sweep: {exc}", file=sys.stderr)
        return 2
    import ray

    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False)
    rows = run_sweep(
        spec,
        args.lr,
        args.batch_size,
        storage_path=args.storage or tempfile.mkdtemp(),
        gpus_per_trial=args.gpus_per_trial,
        team=args.team,
        priority_class=args.priority,
    )
    for row in rows:
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
