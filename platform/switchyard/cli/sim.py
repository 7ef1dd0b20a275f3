"""`switchyard sim`: replay a job trace through a scheduling policy and report waits,
utilisation, fairness, preemption cost and inference SLO attainment."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from switchyard.cli._output import fail, print_json, print_table
from switchyard.scheduler.core.config import PolicyFileError
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.metrics import QUALITY_METRICS
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run
from switchyard.scheduler.sim.teams import TeamsFileError
from switchyard.scheduler.sim.trace import TraceError
from switchyard.scheduler.sim.window import parse_duration


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "sim",
        help="replay a GPU job trace through a scheduling policy",
        description=__doc__,
    )
    parser.add_argument(
        "--trace", type=Path, required=True, help="job CSV: Philly's or the generic format (docs/scheduler.md)"
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--teams", type=Path, help="team sizes CSV (vc,node num); default: philly_vc_nodes.csv next to the trace"
    )
    source.add_argument("--policy-file", type=Path, help="scheduler.yaml (teams, priorities, knobs)")
    parser.add_argument("--gpus", type=int, required=True, help="cluster size (8 GPUs per node)")
    parser.add_argument("--policy", choices=[p.value for p in PolicyName], default="switchyard")
    window = parser.add_mutually_exclusive_group()
    window.add_argument(
        "--window",
        choices=sorted(WINDOWS),
        help="Philly's named windows (sep, oct: 2017; all); earlier jobs are replayed as warm-up",
    )
    window.add_argument(
        "--from", dest="window_from", help="measure from this date (ISO 8601, UTC) or fraction 0..1 of the trace"
    )
    parser.add_argument("--to", dest="window_to", help="measure up to this date or fraction (default: trace end)")
    parser.add_argument(
        "--warmup",
        help="replay jobs submitted this long before --from unmeasured (90s, 30m, 12h, 2d); "
        "default: every earlier job; without --from: the trace's first part",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--azure",
        type=Path,
        help="Azure LLM inference CSV for the inference bursts (default: the Azure conversation trace's, shipped)",
    )
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


def _window(args: argparse.Namespace) -> tuple[str | None, str | None, float | None]:
    if args.window is not None:
        if args.window_to is not None:
            raise ValueError("--window and --to are exclusive: a named window fixes both ends")
        frm, to = WINDOWS[args.window]
        return frm, to, None if args.warmup is None else parse_duration(args.warmup)
    warmup = None if args.warmup is None else parse_duration(args.warmup)
    return args.window_from, args.window_to, warmup


def handle(args: argparse.Namespace) -> int:
    try:
        frm, to, warmup = _window(args)
    except ValueError as err:
        return fail(str(err))
    if args.plot is not None and not args.plot.resolve().parent.is_dir():
        return fail(f"--plot {args.plot}: directory {args.plot.resolve().parent} does not exist")
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
        warmup_s=warmup,
    )
    try:
        result = run(spec)
    except (TraceError, TeamsFileError, PolicyFileError, ValueError) as err:
        return fail(str(err))
    if args.json:
        print_json(result.report)
    else:
        _print_human(result.report)
    if args.plot:
        from switchyard.scheduler.sim.plot import write_plot

        try:
            write_plot(result.trace, args.plot, f"{args.policy} on {args.gpus} GPUs, {_label(args)}")
        except OSError as err:  # the report above is printed: only the plot is lost
            return fail(f"--plot {args.plot}: cannot write: {err.strerror or err}")
    return 0


def _label(args: argparse.Namespace) -> str:
    if args.window is not None:
        return str(args.window)
    return f"{args.window_from or 'start'}..{args.window_to or 'end'}"


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
    keys = ["policy", "capacity_gpus", "offered_load", *QUALITY_METRICS, "most_preempted_job", "events_per_s"]
    print_table(["metric", "value"], [[k, report.get(k, "-")] for k in keys])
    if report["pending"]:
        print()
        reasons = ", ".join(f"{reason} {n}" for reason, n in report["pending_by_reason"].items())
        print(f"pending at the end: {report['pending_at_end']} ({reasons}); the longest waits:")
        longest = sorted(report["pending"], key=lambda p: -p["waited_s"])[:10]
        print_table(
            ["workload", "team", "GPUs", "waited s", "reason", "detail"],
            [[p["workload_id"], p["team"], p["gpus"], p["waited_s"], p["reason"], p["detail"]] for p in longest],
        )
