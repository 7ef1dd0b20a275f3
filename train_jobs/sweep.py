"""A learning-rate x batch-size sweep of a job spec with Ray Tune, on CPU:

    python -m train_jobs.sweep train_jobs/configs/ddp.yaml --lr 1e-3 3e-3 --batch-size 2 4

Prints one JSON line per trial, best (lowest final loss) first.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Sequence

from switchyard.train.spec import JobSpecError, load_job_spec


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m train_jobs.sweep")
    parser.add_argument("config")
    parser.add_argument("--lr", type=float, nargs="+", default=[1e-3, 3e-3])
    parser.add_argument("--batch-size", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--steps", type=int, default=None, help="override the spec's steps")
    args = parser.parse_args(argv)
    try:
        spec = load_job_spec(args.config)
    except JobSpecError as exc:
        print(f"train_jobs.sweep: {exc}", file=sys.stderr)
        return 2
    if args.steps:
        spec = spec.with_changes(steps=args.steps)
    import ray

    from switchyard.train.sweep import run_sweep

    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", include_dashboard=False)
    for row in run_sweep(spec, args.lr, args.batch_size, storage_path=tempfile.mkdtemp()):
        print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
