"""Full trace replay: every policy on the same input, one results table (markdown).

    .venv/bin/python bench/scheduler_sim.py --gpus 672 --window oct [--policy-file F] [--json-dir D]
        [--seeds 0,1,2] [--size-teams]

Prints the overall table, the per-team p99 wait table and each run's simulated events per
second. With several seeds: each seed's tables, then the mean and range over the seeds of
every column, per policy. The tables in docs/scheduler_results.md are this script's output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from sim_inputs import TRACE, for_size

from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.metrics import QUALITY_METRICS
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

COLUMNS = QUALITY_METRICS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--gpus", type=int, default=672)
    parser.add_argument("--window", choices=sorted(WINDOWS), default="oct")
    parser.add_argument("--policy-file", type=Path)
    parser.add_argument("--policies", default=",".join(p.value for p in PolicyName))
    parser.add_argument("--no-anomaly", action="store_true")
    parser.add_argument("--seed", type=int, default=0, help="class assignment and inference seed")
    parser.add_argument("--seeds", help="several seeds, comma-separated (overrides --seed): adds mean and range")
    parser.add_argument("--json-dir", type=Path, help="also write each report as JSON here")
    parser.add_argument(
        "--size-teams",
        action="store_true",
        help="ignore the policy file's teams: size Philly's teams for --gpus (knobs and classes kept)",
    )
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [args.seed]
    by_seed: dict[int, dict[str, dict[str, object]]] = {}
    with for_size(args.policy_file, args.size_teams) as policy_file:
        for seed in seeds:
            by_seed[seed] = run_seed(args, policy_file, seed)
            print(f"\n## seed {seed}\n")
            print_tables(by_seed[seed])
    if len(seeds) > 1:
        print(f"\n## mean [min, max] over seeds {','.join(map(str, seeds))}\n")
        print_spread(by_seed)
    print(f"\nreproduce: {reproduce(args)}")


def reproduce(args: argparse.Namespace) -> str:
    picked = f"--seeds {args.seeds}" if args.seeds else f"--seed {args.seed}"
    words = [".venv/bin/python bench/scheduler_sim.py", f"--gpus {args.gpus} --window {args.window} {picked}"]
    if args.policy_file:
        words.append(f"--policy-file {args.policy_file}")
    if args.policies != ",".join(p.value for p in PolicyName):
        words.append(f"--policies {args.policies}")
    words += [flag for flag, on in (("--size-teams", args.size_teams), ("--no-anomaly", args.no_anomaly)) if on]
    return " ".join(words)


def run_seed(args: argparse.Namespace, policy_file: Path | None, seed: int) -> dict[str, dict[str, object]]:
    reports = {}
    for name in args.policies.split(","):
        frm, to = WINDOWS[args.window]
        spec = SimSpec(
            args.trace,
            args.gpus,
            PolicyName(name),
            frm,
            to,
            policy_file=policy_file,
            anomaly=not args.no_anomaly,
            seed=seed,
        )
        reports[name] = run(spec).report
        if args.json_dir:
            args.json_dir.mkdir(parents=True, exist_ok=True)
            (args.json_dir / f"{args.window}_{args.gpus}_{name}_seed{seed}.json").write_text(
                json.dumps(reports[name], indent=2, sort_keys=True)
            )
        print(
            f"# seed {seed} {name}: {reports[name]['events']} events in {reports[name]['sim_wall_s']} s "
            f"({reports[name]['events_per_s']} events/s)",
            file=sys.stderr,
            flush=True,
        )
    return reports


def _spread(values: list[float]) -> str:
    mean = sum(values) / len(values)
    digits = 4 if max(abs(v) for v in values) < 10 else 0
    return f"{mean:.{digits}f} [{min(values):.{digits}f}, {max(values):.{digits}f}]"


def print_spread(by_seed: dict[int, dict[str, dict[str, object]]]) -> None:
    runs = list(by_seed.values())
    print("| policy | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name in runs[0]:
        cells = []
        for column in COLUMNS:
            values = [r[name].get(column) for r in runs]
            numbers = [float(v) for v in values if isinstance(v, int | float)]
            cells.append(_spread(numbers) if len(numbers) == len(values) else "-")
        print(f"| {name} | " + " | ".join(cells) + " |")
    first = runs[0][next(iter(runs[0]))]
    teams = sorted(first["teams"])  # type: ignore[call-overload]
    print("\nper team, mean over seeds: p99 wait (s) per policy; private cluster p99; share of jobs with rho <= 1")
    print("| team | quota | " + " | ".join(runs[0]) + " | private cluster | rho <= 1 (" + next(iter(runs[0])) + ") |")
    print("|---" * (len(runs[0]) + 4) + "|")
    for team in teams:
        rows = [{name: r[name]["teams"][team] for name in r} for r in runs]  # type: ignore[index]
        cells = [f"{sum(float(x[name]['wait_p99_s']) for x in rows) / len(rows):.0f}" for name in runs[0]]
        first_policy = next(iter(runs[0]))
        private = [x[first_policy].get("wait_p99_private_s") for x in rows]
        rho = [x[first_policy].get("finish_time_fairness", {}).get("share_rho_at_most_1") for x in rows]
        private_cell = f"{sum(private) / len(private):.0f}" if all(v is not None for v in private) else "-"
        rho_cell = f"{sum(rho) / len(rho):.4f}" if all(v is not None for v in rho) else "-"
        quota = rows[0][first_policy]["quota_gpus"]
        print(f"| {team} | {quota} | " + " | ".join(cells) + f" | {private_cell} | {rho_cell} |")


def print_tables(reports: dict[str, dict[str, object]]) -> None:
    first = next(iter(reports.values()))
    print(f"offered load {first['offered_load']} on {first['capacity_gpus']} GPUs\n")
    print("| policy | " + " | ".join(COLUMNS) + " |")
    print("|---" * (len(COLUMNS) + 1) + "|")
    for name, report in reports.items():
        print(f"| {name} | " + " | ".join(str(report.get(c, "-")) for c in COLUMNS) + " |")
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
    print("\nper team: share of jobs with rho <= 1 (finish-time fairness vs its private cluster); share ratio")
    print("| team | " + " | ".join(reports) + " |")
    print("|---" * (len(reports) + 1) + "|")
    for team in teams:
        cells = []
        for report in reports.values():
            t = report["teams"][team]  # type: ignore[index]
            ftf = t.get("finish_time_fairness", {})
            cells.append(f"{ftf.get('share_rho_at_most_1', '-')}; {t.get('share_ratio', '-')}")
        print(f"| {team} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
