"""`switchyard sim`: replay a job trace through a scheduling policy and report waits,
utilisation, fairness, preemption cost and inference SLO attainment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from switchyard.cli._output import fail, print_json, print_table
from switchyard.scheduler.core.config import PolicyFileError
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run
from switchyard.scheduler.sim.teams import TeamsFileError
from switchyard.scheduler.sim.trace import TraceError


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="replay a GPU job trace through a scheduling policy",
        description=__doc__,
    )
    parser.add_argument("--trace", type=Path, required=True, help="Philly-format job CSV")
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--teams", type=Path, help="team sizes CSV (vc,node num); default: philly_vc_nodes.csv next to the trace"
    )
    source.add_argument("--policy-file", type=Path, help="scheduler.yaml (teams, priorities, knobs)")
    parser.add_argument("--gpus", type=int, required=True, help="cluster size (8 GPUs per node)")
    parser.add_argument("--policy", choices=[p.value for p in PolicyName], default="switchyard")
    parser.add_argument(
        "--window", choices=sorted(WINDOWS), default="oct", help="report window; earlier jobs are replayed as warm-up"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--azure", type=Path, help="Azure LLM inference CSV (burstiness)")
    parser.add_argument("--no-inference", action="store_true", help="replay training jobs only")
    parser.add_argument("--inference-peak-rps", type=float, help="peak inference requests/s (default 0.25 per GPU)")
    parser.add_argument(
        "--slo-bound-s",
        type=float,
        default=300.0,
        help="an inference replica must get its GPU within this many seconds",
    )
    parser.add_argument("--max-jobs", type=int, help="keep only the first N window jobs")
    parser.add_argument(
        "--no-anomaly", action="store_true", help="skip the private-cluster runs behind sharing_anomaly_s"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, help="write wait CDFs and utilisation to this PNG")
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    frm, to = WINDOWS[args.window]
    spec = SimSpec(
        trace=args.trace,
        gpus=args.gpus,
        policy=PolicyName(args.policy),
        window_from=frm,
        window_to=to,
        teams_file=args.teams,
        policy_file=args.policy_file,
        azure_file=args.azure,
        inference=not args.no_inference,
        inference_peak_rps=args.inference_peak_rps,
        slo_bound_s=args.slo_bound_s,
        seed=args.seed,
        anomaly=not args.no_anomaly,
        max_jobs=args.max_jobs,
    )
    try:
        result = run(spec)
    except (TraceError, TeamsFileError, PolicyFileError, ValueError) as err:
        return fail(str(err))
    if args.plot:
        from switchyard.scheduler.sim.plot import write_plot

        write_plot(result.trace, args.plot, f"{args.policy} on {args.gpus} GPUs, {args.window}")
    if args.json:
        print_json(result.report)
        return 0
    _print_human(result.report)
    return 0


def _print_human(report: dict[str, Any]) -> None:
    rows = []
    for team, row in report["teams"].items():
        gangs = row["wait_by_gang"]
        rows.append(
            [
                team,
                row["quota_gpus"],
                row["jobs"],
                row["wait_p50_s"],
                row["wait_p90_s"],
                row["wait_p99_s"],
                gangs["1"]["wait_p99_s"],
                gangs["2-4"]["wait_p99_s"],
                gangs["8+"]["wait_p99_s"],
                row["jct_mean_s"],
                row.get("sharing_anomaly_s", "-"),
            ]
        )
    print_table(
        ["team", "quota", "jobs", "wait p50", "p90", "p99", "p99 1", "p99 2-4", "p99 8+", "JCT mean", "anomaly"], rows
    )
    print()
    keys = [
        "policy",
        "capacity_gpus",
        "offered_load",
        "utilization",
        "jain_fairness",
        "inference_slo_attainment",
        "priority_inversion_hours",
        "preemptions",
        "lost_gpu_hours",
        "worst_team_wait_p99_s",
        "events_per_s",
    ]
    print_table(["metric", "value"], [[k, report[k]] for k in keys])
