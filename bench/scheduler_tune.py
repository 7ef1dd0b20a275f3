"""Tune switchyard's knobs on September only (October is the reported month).

September's offered load at 672 GPUs is only ~0.5, so tuning runs at the capacity that gives
September the evaluation load of ~0.9 (--gpus 360 by default).

    .venv/bin/python bench/scheduler_tune.py [--gpus 360]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from switchyard.scheduler.core.policy import PolicyKnobs
from switchyard.scheduler.sim.baselines import PolicyName
from switchyard.scheduler.sim.run import WINDOWS, SimSpec, run

TRACE = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly_jobs_sep_oct_2017.csv"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=360)
    parser.add_argument("--reservations", default="0,1,2,4")
    parser.add_argument("--half-lives-h", default="1,6,24")
    parser.add_argument("--starvation-h", default="0,6,24", help="0 = aging off")
    parser.add_argument("--restart-s", default="600,3600")
    parser.add_argument("--baselines", action="store_true", help="also run the baselines")
    args = parser.parse_args()
    frm, to = WINDOWS["sep"]
    print("| max_reservations | half-life h | aging h | restart s | util | jain | worst p99 s "
          "| lost GPU-h | preemptions |")
    print("|---|---|---|---|---|---|---|---|---|")
    for reservations, half_life, aging, restart in itertools.product(
        [int(x) for x in args.reservations.split(",")],
        [float(x) for x in args.half_lives_h.split(",")],
        [float(x) for x in args.starvation_h.split(",")],
        [float(x) for x in args.restart_s.split(",")],
    ):
        knobs = replace(PolicyKnobs(), max_reservations=reservations,
                        usage_half_life_s=half_life * 3600,
                        starvation_after_s=aging * 3600 if aging else None,
                        restart_cost_s=restart)
        r = run(SimSpec(TRACE, args.gpus, PolicyName.SWITCHYARD, frm, to, anomaly=False,
                        knobs=knobs)).report
        print(f"| {reservations} | {half_life:g} | {aging:g} | {restart:g} | {r['utilization']} | "
              f"{r['jain_hourly_mean']} | {r['worst_team_wait_p99_s']} | {r['lost_gpu_hours']} | {r['preemptions']} |",
              flush=True)
    for name in PolicyName:
        if name is PolicyName.SWITCHYARD or not args.baselines:
            continue
        r = run(SimSpec(TRACE, args.gpus, name, frm, to, anomaly=False)).report
        print(f"| baseline {name} | | | | {r['utilization']} | {r['jain_hourly_mean']} | "
              f"{r['worst_team_wait_p99_s']} | {r['lost_gpu_hours']} | {r['preemptions']} |",
              flush=True)
    print(f"\nreproduce: .venv/bin/python bench/scheduler_tune.py --gpus {args.gpus}")


if __name__ == "__main__":
    main()
