"""Decision latency of the scheduler core at 10,000 GPUs (1,250 nodes) with 5,000 pending.

Fills the cluster with running leases (mixed gang sizes, several teams, some borrowing), queues
5,000 more requests, then replays a stream of events (a lease ends, a request arrives, a
checkpoint is reported, time advances) and times each `event + schedule(now)` pair, which is
what the live driver pays per event. Preemption searches are included. The knobs and
priority classes (victim-search budget, protection) are the policy file's, the same file the
quality tables in docs/scheduler_results.md use; the teams are generated for the size. The
harness's own work (choosing which lease ends) is outside the timed region.

    .venv/bin/python bench/scheduler_latency.py [--events 3000] [--seed 0] [--policy-file F]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from switchyard.scheduler.core import (
    GangRequest,
    PlacementStrategy,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.sim.engine import Cluster

POLICY_FILE = Path(__file__).resolve().parent / "philly_scheduler.yaml"

TEAMS = 12
SHAPES = [((1,), 60), ((2,), 10), ((4,), 10), ((8,), 12), ((8, 8), 5), ((8, 8, 8, 8), 3)]
PRIORITY = {
    WorkloadClass.TRAINING: "training",
    WorkloadClass.BATCH_FINE_TUNE: "batch",
    WorkloadClass.EXPLORATORY: "exploratory",
}


def build(gpus: int, policy_file: Path) -> Scheduler:
    shipped = load_policy_file(policy_file).to_policy()
    research = frozenset(PRIORITY)
    share = (gpus - 400) // TEAMS
    teams = [Team(f"team{i}", (Quota(research, share),), float(share)) for i in range(TEAMS)]
    teams.append(Team("inference", (Quota(frozenset({WorkloadClass.INFERENCE}), 400, 0),), 400.0))
    policy = SchedulerPolicy(shipped.priority_classes, tuple(teams), shipped.knobs)
    return Scheduler(policy, Cluster(gpus).nodes())


def request(rng: random.Random, n: int) -> GangRequest:
    bundles = rng.choices([s for s, _ in SHAPES], weights=[w for _, w in SHAPES])[0]
    if rng.random() < 0.05:
        return GangRequest(f"w{n}", "inference", WorkloadClass.INFERENCE, "production-inference",
                           (1,))
    klass = rng.choice(list(PRIORITY))
    return GangRequest(f"w{n}", f"team{rng.randrange(TEAMS)}", klass, PRIORITY[klass], bundles,
                       PlacementStrategy.PACK, len(bundles) > 1, None,
                       rng.choice([None, 900.0, 1800.0]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=10_000)
    parser.add_argument("--pending", type=int, default=5_000)
    parser.add_argument("--events", type=int, default=3_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--policy-file", type=Path, default=POLICY_FILE)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    s = build(args.gpus, args.policy_file)
    n = 0
    now = 0.0
    while s.pool.free_gpus > 64:  # fill
        n += 1
        s.submit(request(rng, n), now)
        if n % 200 == 0:
            s.schedule(now)
            now += 1.0
    s.schedule(now)
    for _ in range(args.pending):
        n += 1
        s.submit(request(rng, n), now)
    now += 3600.0  # past minimum runtimes: victims exist
    s.schedule(now)
    samples = []
    starts = notices = 0
    for _ in range(args.events):
        now += rng.uniform(0.5, 5.0)
        roll = rng.random()
        leases = s.leases()  # the harness's choice, not timed
        chosen = rng.choice(sorted(leases)) if leases else None
        if roll < 0.45 and chosen is not None:
            t0 = time.perf_counter()
            s.release(chosen, now, finished=True)
        elif roll < 0.9:
            n += 1
            new = request(rng, n)
            t0 = time.perf_counter()
            s.submit(new, now)
        else:
            t0 = time.perf_counter()
            if chosen is not None:
                s.report_checkpoint(leases[chosen].request.workload_id, now)
        decisions = s.schedule(now)
        samples.append(time.perf_counter() - t0)
        for stop in decisions.stops:
            s.release(stop.lease_id, now)
        starts += len(decisions.starts)
        notices += len(decisions.notices)
    ms = sorted(x * 1000 for x in samples)

    def p(q: float) -> float:
        return ms[min(len(ms) - 1, int(q * len(ms)))]

    print(f"cluster: {s.pool.total_gpus} GPUs on {len(list(s.pool.nodes()))} nodes; "
          f"pending at end: {s.pending_count()}; running leases: {len(s.leases())}")
    print(f"events: {len(ms)}; starts: {starts}; preemption notices: {notices}")
    print(f"decision latency (event + schedule): p50 {p(0.50):.2f} ms  p99 {p(0.99):.2f} ms  "
          f"max {ms[-1]:.2f} ms  mean {statistics.fmean(ms):.2f} ms")
    print("reproduce: .venv/bin/python bench/scheduler_latency.py "
          f"--gpus {args.gpus} --pending {args.pending} --events {args.events} --seed {args.seed}"
          f" --policy-file {args.policy_file}")


if __name__ == "__main__":
    main()
