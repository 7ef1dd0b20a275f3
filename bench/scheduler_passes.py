"""What event-driven passes save the live scheduler at 10,000 GPUs (1,250 nodes) with 5,000 pending.

In process, no Ray: the real `Driver` (the state `bench/scheduler_gauges.py` builds: 1,250
logical nodes x 8 GPUs full, `--pending` one-node gangs waiting), then `--seconds` of the
actor's 0.25 s ticks, two ways, from copies of the same state:

- every tick: a scheduling pass and a write-ahead-log record per tick, as the actor did until
  issue 19;
- event-driven: a pass only when `Driver.pass_due` says one could decide something (here,
  with nothing happening, the idle pass every `IDLE_PASS_S` while work is queued), then the
  same again with one release every `--release-every` s (each frees a node for the oldest
  gang: a pass follows it).

Prints passes, log records and CPU time spent in passes for each, and the ratio.

    nice .venv/bin/python bench/scheduler_passes.py [--nodes 1250] [--pending 5000] [--seconds 60]
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from scheduler_gauges import build

from switchyard.scheduler.driver import Driver, inputs

TICK_S = 0.25


def run(d: Driver, seconds: float, event_driven: bool, release_every: float | None) -> tuple[int, int, float]:
    """Ticks over `seconds`; returns (passes, log records, seconds of CPU in passes)."""
    now, end = 10.0, 10.0 + seconds
    passes = records = 0
    spent = 0.0
    next_release = now + release_every if release_every else float("inf")
    while now < end:
        now += TICK_S
        if now >= next_release:
            next_release += release_every or 0
            lease = next(iter(d.state.grants.values()))
            inputs.apply(d, inputs.release(lease.lease_id, True, now))
            records += 1
        if event_driven and not d.pass_due(now):
            continue
        started = time.process_time()
        inputs.apply(d, inputs.tick(now))
        spent += time.process_time() - started
        passes += 1
        records += 1
    return passes, records, spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--release-every", type=float, default=5.0)
    args = parser.parse_args()
    base = build(args.nodes, args.pending)
    base.tick(9.0)  # settled: the next tick has nothing new to look at
    print(f"{args.nodes} nodes x 8 GPUs, {len(base.state.grants)} leases, {base.state.core.pending_count()} pending")
    print(f"{args.seconds:.0f} s of {TICK_S} s ticks")
    print(f"{'case':<42} {'passes':>7} {'records':>8} {'pass CPU s':>11}")
    for label, release_every in (("idle", None), (f"one release every {args.release_every:g} s", args.release_every)):
        rows = {}
        for event_driven in (False, True):
            passes, records, spent = run(copy.deepcopy(base), args.seconds, event_driven, release_every)
            rows[event_driven] = spent
            how = "event-driven" if event_driven else "every tick"
            print(f"{label + ', ' + how:<42} {passes:>7} {records:>8} {spent:>11.3f}")
        if rows[True] > 0:
            print(f"{label}: pass CPU every tick / event-driven = {rows[False] / rows[True]:.1f}x")
    print(
        "reproduce: nice .venv/bin/python bench/scheduler_passes.py "
        f"--nodes {args.nodes} --pending {args.pending} --seconds {args.seconds:g}"
        f" --release-every {args.release_every:g}"
    )


if __name__ == "__main__":
    main()
