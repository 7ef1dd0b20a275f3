"""What the live scheduler's gauges cost per tick at 10,000 GPUs (1,250 nodes) with 5,000 pending.

In process, no Ray: the real `Driver` on 1,250 logical nodes x 8 GPUs, filled with one-node
gangs of several teams and priorities, then `--pending` more that wait. Times, each the median
of `--repeats` calls:

- before: the readings as the actor built them until issue 19, from a full
  `core.snapshot(now, explain_pending=False)` (every team, pool and lease) under the lock;
- after: `views.gauge_readings`, from the counts the driver's `LiveTally` keeps as events
  happen (plus the team GPUs and fairness readings added since);
- the tally's own cost per event (integrating the fairness timeline up to `now` and following
  one workload), which every submit, release and tick now pays;
- rebuilding the tally from the state (a driver built from a snapshot, or after the Serve
  pool changed the core).

    nice .venv/bin/python bench/scheduler_gauges.py [--nodes 1250] [--pending 5000] [--repeats 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.claims import ClaimPolicy
from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    LeaseState,
    PolicyKnobs,
    Quota,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.driver import Driver, LiveState, views
from switchyard.scheduler.driver.tally import LiveTally
from switchyard.scheduler.sim.engine import Cluster

TEAMS = 12
PRIORITIES = (("training", WorkloadClass.TRAINING), ("exploratory", WorkloadClass.EXPLORATORY))


def snapshot_readings(state: LiveState, now: float) -> views.GaugeReadings:
    """The readings as they were built before the tally (the old `views.gauge_readings`)."""
    snap = state.core.snapshot(now, explain_pending=False)
    leases = {s.value: 0 for s in LeaseState}
    for lease in snap.leases:
        leases[lease.state] = leases.get(lease.state, 0) + 1
    return views.GaugeReadings(
        free_gpus=snap.free_gpus,
        leased_gpus=snap.total_gpus - snap.free_gpus,
        leases=leases,
        queued={team.team: team.queued for team in snap.teams},
        team_gpus={},
        share_ratio={},
        jain=1.0,
        inversion_gpu_s={},
        quota_wait_gpu_s={},
    )


def build(nodes: int, pending: int) -> Driver:
    gpus = nodes * 8
    everything = frozenset(WorkloadClass)
    teams = tuple(Team(f"team-{t:02d}", (Quota(everything, gpus // TEAMS),), 1.0) for t in range(TEAMS))
    policy = SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, teams, PolicyKnobs())
    d = Driver.empty(policy, 0.0, ClaimPolicy(timeout_s=1e9))
    d.nodes_seen(Cluster(gpus=gpus).nodes(), 0.0)
    for i in range(nodes + pending):
        priority, workload_class = PRIORITIES[i % 2]
        sub = WorkloadSubmission(
            workload_id=f"w{i:05d}",
            team=teams[i % TEAMS].name,
            workload_class=workload_class,
            priority_class=priority,
            bundles=(8,),
        )
        d.submit(sub, 1.0 if i < nodes else 2.0)
        if i == nodes - 1:
            d.tick(1.0)  # the first `nodes` fill the cluster
    d.tick(2.0)
    return d


def median_ms(call: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=1250)
    parser.add_argument("--pending", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    d = build(args.nodes, args.pending)
    state, tally = d.state, d.tally
    now = 4000.0
    assert state.core.pending_count() == args.pending and len(state.grants) == args.nodes
    before = snapshot_readings(state, now)
    after = views.gauge_readings(state, tally, now)
    assert (before.free_gpus, before.leases, before.queued) == (after.free_gpus, after.leases, after.queued)
    wid = next(iter(state.queued_since))
    clock = iter(range(10**9))

    def per_event() -> None:
        tally.advance(now + next(clock) * 0.001)
        tally.follow(state, [wid])

    print(f"{args.nodes} nodes x 8 GPUs, {len(state.grants)} leases, {state.core.pending_count()} pending")
    snapshot_ms = median_ms(lambda: snapshot_readings(state, now), args.repeats)
    tally_ms = median_ms(lambda: views.gauge_readings(state, tally, now), args.repeats)
    print(f"gauge readings, before (snapshot): {snapshot_ms:.3f} ms")
    print(f"gauge readings, after (tally):     {tally_ms:.3f} ms")
    print(f"tally bookkeeping per event:       {median_ms(per_event, args.repeats * 10):.4f} ms")
    print(f"tally rebuilt from the state:      {median_ms(lambda: LiveTally.of(state), 5):.1f} ms")


if __name__ == "__main__":
    main()
