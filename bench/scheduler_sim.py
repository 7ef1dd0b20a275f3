"""Full trace replay: every policy on the same input, one results table (markdown).

    .venv/bin/python bench/scheduler_sim.py --gpus 672 --window oct [--policy-file F] [--json-dir D]

Prints the overall table, the per-team p99 wait table and each run's simulated events per
second. The table in docs/scheduler_results.md is this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly_jobs_sep_oct_2017.csv"
COLUMNS = [
    "utilization",
    "jain_fairness",
    "inference_slo_attainment",
    "worst_team_wait_p99_s",
    "priority_inversion_hours",
    "preemptions",
    "max_preemptions_per_job",
    "lost_gpu_hours",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--gpus", type=int, default=672)
    parser.add_argument("--window", choices=sorted(WINDOWS), default="oct")
    parser.add_argument("--policy-file", type=Path)
    parser.add_argument("--policies", default=",".join(p.value for p in PolicyName))
    parser.add_argument("--no-anomaly", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="class assignment and inference seed")
    parser.add_argument("--json-dir", type=Path, help="also write each report as JSON here")
    args = parser.parse_args()
    reports = {}
    for name in args.policies.split(","):
        frm, to = WINDOWS[args.window]
        spec = SimSpec(
            args.trace,
            args.gpus,
            PolicyName(name),
            frm,
            to,
            policy_file=args.policy_file,
            anomaly=not args.no_anomaly,
            seed=args.seed,
        )
        reports[name] = run(spec).report
        if args.json_dir:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            (args.json_dir / f"{args.window}_{args.gpus}_{name}_seed{args.seed}.json").write_text(
                json.dumps(reports[name], indent=2, sort_keys=True)
            )
        print(
            f"# {name}: {reports[name]['events']} events in {reports[name]['sim_wall_s']} s "
            f"({reports[name]['events_per_s']} events/s)",
            file=sys.stderr,
        )
    print_tables(reports)
    extra = f" --policy-file {args.policy_file}" if args.policy_file else ""
    print(
        f"\nreproduce: .venv/bin/python bench/scheduler_sim.py --gpus {args.gpus} "
        f"--window {args.window} --seed {args.seed}{extra}"
    )


def print_tables(reports: dict[str, dict[str, object]]) -> None:
    first = next(iter(reports.values()))
    print(f"offered load {first['offered_load']} on {first['capacity_gpus']} GPUs\n")
    print("| policy | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, report in reports.items():
        print(f"| {name} | " + " | ".join(str(report[c]) for c in COLUMNS) + " |")
    teams = sorted(first["teams"])  # type: ignore[call-overload]
    print("\np99 wait (s) per team; in brackets: p99 of gangs of 8+ GPUs")
    print("| team | quota | jobs | " + " | ".join(reports) + " | private cluster |")
    print("|---" * (len(reports) + 4) + "|")
    for team in teams:
        row = first["teams"][team]  # type: ignore[index]
        cells = []
        for report in reports.values():
            t = report["teams"][team]  # type: ignore[index]
            cells.append(f"{t['wait_p99_s']:.0f} ({t['wait_by_gang']['8+']['wait_p99_s']:.0f})")
        private = row.get("wait_p99_private_s", "-")
        print(f"| {team} | {row['quota_gpus']} | {row['jobs']} | " + " | ".join(cells) + f" | {private} |")


if __name__ == "__main__":
    main()
