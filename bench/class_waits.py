"""What a knob costs each priority class: the waits of training, batch and exploratory jobs.

The quality tables report the worst team and each team's p99; a rule that speeds up big
training gangs can still make lower classes wait longer, which those columns do not show.
This runs switchyard on a window at one size, once per value of one knob (`--vary knob=v1,v2`,
`none` for an optional knob turned off; without it, the policy file as it is), and prints per
priority class the p50, p99 and longest wait of the jobs submitted in the window, and how
many of them queued longer than a day: mean [min, max] over the seeds.

    .venv/bin/python bench/class_waits.py --gpus 672 --window oct --seeds 0,1,2 \\
        --vary reservation_move_gpus=none,4
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from scheduler_tune import parse_variation, spread
from sim_inputs import TRACE, add_run_arguments, for_size

from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.core.policy import PolicyKnobs
from switchyard.scheduler.fairness import percentile
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

DAY_S = 86400.0


def class_waits(spec: SimSpec) -> dict[str, dict[str, float]]:
    """Per priority class: p50, p99 and longest wait (s) of the window's jobs, and how many
    queued longer than a day."""
    trace = run(spec).trace
    waits: dict[str, list[float]] = {}
    for job in trace.jobs:
        if trace.window.start_s <= job.submit_s < trace.window.end_s:
            waits.setdefault(job.priority_class, []).append(job.wait_s)
    return {
        name: {
            "jobs": len(w),
            "p50": percentile(w, 50),
            "p99": percentile(w, 99),
            "max": max(w),
            "over_a_day": sum(x > DAY_S for x in w),
        }
        for name, w in sorted(waits.items())
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_run_arguments(parser, gpus=672, window="oct", size_teams=False)
    parser.add_argument("--vary", help="knob=v1,v2: one row per value")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    frm, to = WINDOWS[args.window]
    shipped = load_policy_file(args.policy_file).to_policy().knobs
    settings: list[tuple[str, PolicyKnobs | None]] = [("the policy file", None)]
    if args.vary:
        name, values = parse_variation(args.vary)
        settings = [(f"{name} = {v}", dataclasses.replace(shipped, **{name: v})) for v in values]
    print(f"{args.window} at {args.gpus} GPUs; mean [min, max] over seeds {args.seeds}\n")
    print("| setting | class | jobs | p50 wait s | p99 wait s | longest wait s | queued > 1 day |")
    print("|---|---|---|---|---|---|---|")
    with for_size(args.policy_file, args.size_teams) as policy_file:
        for label, knobs in settings:
            runs = [
                class_waits(
                    SimSpec(
                        TRACE,
                        args.gpus,
                        window_from=frm,
                        window_to=to,
                        policy_file=policy_file,
                        anomaly=False,
                        seed=seed,
                        knobs=knobs,
                    )
                )
                for seed in seeds
            ]
            for name in sorted({c for r in runs for c in r}):
                rows = [r[name] for r in runs if name in r]
                cells = [spread([float(x[k]) for x in rows]) for k in ("jobs", "p50", "p99", "max", "over_a_day")]
                print(f"| {label} | {name} | " + " | ".join(cells) + " |", flush=True)
    varied = f" --vary {args.vary}" if args.vary else ""
    sized = " --size-teams" if args.size_teams else ""
    print(
        f"\nreproduce: .venv/bin/python bench/class_waits.py --gpus {args.gpus} --window {args.window} "
        f"--seeds {args.seeds} --policy-file {args.policy_file}{varied}{sized}"
    )


if __name__ == "__main__":
    main()
