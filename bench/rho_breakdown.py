"""Why a team's jobs finish later shared than alone: its jobs with rho > 1, by cause.

rho is a job's completion time on the shared cluster over its completion time on the team's
private cluster (`docs/scheduler.md`, "Fairness"). This replays the window once shared (the
policy file's switchyard) and each named team alone on its private cluster (as `switchyard
sim` sizes it), then splits the finished jobs with rho > 1 into those that were preempted on
the shared cluster and those that only waited longer, with how much longer they waited and
how long they ran.

    .venv/bin/python bench/rho_breakdown.py --gpus 672 --window oct --seed 0 --teams 6214e9,b436b2,11cb48,ed69ec,ee9e8c
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from sim_inputs import POLICY_FILE, TRACE

from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.fairness import percentile
from switchyard.scheduler.sim.engine import JobRecord, SimWindow
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, private_cluster_gpus, private_knobs, run, run_private
from switchyard.scheduler.sim.trace import load_trace
from switchyard.scheduler.sim.window import resolve_window, select_jobs


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return " / ".join(f"{percentile(values, q):,.0f}" for q in (10, 50, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=672)
    parser.add_argument("--window", choices=sorted(WINDOWS), default="oct")
    parser.add_argument("--teams", required=True, help="comma-separated team names")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--policy-file", type=Path, default=POLICY_FILE)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    frm, to = WINDOWS[args.window]
    # anomaly=False: the private runs are below, for the teams asked for only
    spec = SimSpec(
        args.trace,
        args.gpus,
        window_from=frm,
        window_to=to,
        policy_file=args.policy_file,
        seed=args.seed,
        anomaly=False,
    )
    result = run(spec)
    shared = {r.workload_id: r for r in result.trace.jobs}
    teams = result.report["teams"]
    assert isinstance(teams, dict)
    asked = args.teams.split(",")
    unknown = [t for t in asked if t not in teams]
    if unknown:
        raise SystemExit(f"no such team in the {args.window} window: {', '.join(unknown)} (teams: {', '.join(teams)})")
    knobs = private_knobs(load_policy_file(args.policy_file).to_policy().knobs)
    trace = load_trace(args.trace, args.seed)
    replay = resolve_window(trace, frm, to, None)
    window = SimWindow(replay.start_s, replay.end_s, spec.tail_days * 86400)
    jobs = select_jobs(trace.jobs, replay, None)
    print(f"# {' '.join(sys.argv)}")
    print(
        "| team | quota | private GPUs | finished jobs | rho > 1 | of those preempted | "
        "extra wait of the rest s (p10 / p50 / p90) | run time of the rest s (p10 / p50 / p90) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for team in asked:
        mine = [j for j in jobs if j.team == team]
        quota = int(teams[team]["quota_gpus"])
        gpus = private_cluster_gpus(quota, mine)
        slower: list[tuple[JobRecord, JobRecord]] = []
        finished = 0
        for alone in run_private(team, mine, gpus, window, knobs).jobs:
            together = shared.get(alone.workload_id)
            if together is None or together.finish_s is None or alone.finish_s is None:
                continue
            finished += 1
            if together.finish_s - together.submit_s > (alone.finish_s - alone.submit_s) * (1 + 1e-9):
                slower.append((together, alone))
        preempted = sum(1 for s, _ in slower if s.preemptions)
        rest = [(s, a) for s, a in slower if not s.preemptions]
        print(
            f"| {team} | {quota} | {gpus} | {finished:,} | {len(slower) / max(finished, 1):.3f} | "
            f"{preempted / max(len(slower), 1):.2f} | {spread([s.wait_s - a.wait_s for s, a in rest])} | "
            f"{spread([s.duration_s for s, _ in rest])} |"
        )


if __name__ == "__main__":
    main()
