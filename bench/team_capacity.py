"""How many GPUs one team needs for a given p99 wait: its jobs alone on private clusters.

The worst-team p99 of a fair-share scheduler is bounded below by what the team's own demand
needs: a team that submits about twice its guarantee for a month waits, on any policy that
gives it about its fair share, about as long as it would on a private cluster of that share.
This replays one team's jobs of a window (with the warm-up before it, as `switchyard sim`
does) on private clusters of several sizes, with switchyard's rules (`run.private_knobs`),
and prints the team's p99 and p50 wait and its mean demand, so an operator can read off the
guarantee a wait target needs.

    .venv/bin/python bench/team_capacity.py --team 2869ce --window oct --gpus 32,40,48,56,64,80,96

`--by-size` adds, per cluster size, the waits of each job size and priority class: which of
the team's jobs set its p99.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from sim_inputs import POLICY_FILE, TRACE

from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.fairness import percentile
from switchyard.scheduler.sim.engine import SimWindow
from switchyard.scheduler.sim.run import WINDOWS, private_knobs, run_private
from switchyard.scheduler.sim.trace import load_trace
from switchyard.scheduler.sim.window import resolve_window, select_jobs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--team", required=True)
    parser.add_argument("--window", choices=sorted(WINDOWS), help="Philly's named months (sets --from/--to)")
    parser.add_argument("--from", dest="window_from", help="date or fraction of the trace; default: its start")
    parser.add_argument("--to", dest="window_to", help="date or fraction; default: the trace's end")
    parser.add_argument("--gpus", default="32,40,48,56,64,80,96", help="private cluster sizes (multiples of 8)")
    parser.add_argument("--trace", type=Path, default=TRACE)
    parser.add_argument("--policy-file", type=Path, default=POLICY_FILE)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--by-size", action="store_true", help="also each job size and class's waits")
    args = parser.parse_args()
    knobs = private_knobs(load_policy_file(args.policy_file).to_policy().knobs)
    trace = load_trace(args.trace, args.seed)
    frm, to = WINDOWS[args.window] if args.window else (args.window_from, args.window_to)
    replay = resolve_window(trace, frm, to, None)
    window = SimWindow(replay.start_s, replay.end_s, 30 * 86400.0)
    jobs = [j for j in select_jobs(trace.jobs, replay, None) if j.team == args.team]
    measured = [j for j in jobs if replay.start_s <= j.submit_s < replay.end_s]
    if not measured:
        raise SystemExit(f"team {args.team!r} has no jobs in the window {frm} .. {to}")
    demand = sum(j.gpus * j.duration_s for j in measured) / (replay.end_s - replay.start_s)
    print(
        f"# team {args.team}, {frm} .. {to} (seed {args.seed}): {len(measured)} jobs, mean demand {demand:.1f} GPUs, "
        f"largest gang {max(j.gpus for j in measured)} GPUs"
    )
    print(f"# {' '.join(sys.argv)}")
    print("| private GPUs | p50 wait s | p99 wait s | max wait s |")
    print("|---|---|---|---|")
    by_size: list[str] = []
    for gpus in (int(x) for x in args.gpus.split(",")):
        result = run_private(args.team, jobs, gpus, window, knobs)
        done = [r for r in result.jobs if replay.start_s <= r.submit_s < replay.end_s]
        waits = [r.wait_s for r in done]
        print(f"| {gpus} | {percentile(waits, 50):,.0f} | {percentile(waits, 99):,.0f} | {max(waits):,.0f} |")
        if not args.by_size:
            continue
        groups: dict[tuple[int, str], list[float]] = {}
        for r in done:
            groups.setdefault((r.gpus, r.priority_class), []).append(r.wait_s)
        by_size += [
            f"| {gpus} | {size} | {cls} | {len(w)} | "
            f"{percentile(w, 50):,.0f} | {percentile(w, 99):,.0f} | {max(w):,.0f} |"
            for (size, cls), w in sorted(groups.items())
        ]
    if args.by_size:
        print("\n| private GPUs | job GPUs | class | jobs | p50 wait s | p99 wait s | max wait s |")
        print("|---|---|---|---|---|---|---|")
        print("\n".join(by_size))


if __name__ == "__main__":
    main()
