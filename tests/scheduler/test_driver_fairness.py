"""Live fairness and the gauges' counts, through the real driver (issue 19): share ratios, Jain's
index and inversion computed by the simulator's code on the live events, and counts kept as
events happen that equal what a full snapshot says."""

from __future__ import annotations

import heapq
import random
from dataclasses import replace

import pytest
from driver_support import GRACE_S, driver, submission
from sched_support import policy

from switchyard.cli.status import render_fairness
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.claims import ClaimPolicy
from switchyard.scheduler.core import LeaseState, Node, Ordering, PlacementStrategy, PolicyKnobs, PreemptionMode
from switchyard.scheduler.driver import Driver, views
from switchyard.scheduler.driver.effects import Effect, JournalEvent
from switchyard.scheduler.driver.tally import LiveTally, TeamGpus
from switchyard.scheduler.fairness import jain
from switchyard.scheduler.sim.engine import Cluster, Simulation, SimWindow
from switchyard.scheduler.sim.trace import TraceJob

HOUR = 3600.0


def test_share_ratios_jain_and_inversion_of_a_scripted_hour() -> None:
    """16 GPUs, a and b guaranteed 8 each. a runs 16 exploratory GPUs all hour; at 30 min b
    queues 4 and 16 GPUs of training, and nothing is scheduled until the hour ends.
    First half: only a asks, its fair share is all 16. Second half: a asks 16, b 20; weighted
    max-min gives each 8. a received 16 x 3600 of a fair 16 x 1800 + 8 x 1800: ratio 4/3;
    b received 0 of 8 x 1800: ratio 0; Jain(4/3, 0) = (4/3)^2 / (2 x 16/9) = 0.5.
    From 300 s after b queued (at 2100 s) to 3600 s, lower priority holds 16 GPUs: b's 4-GPU
    request fits its guarantee (an inversion, 4 x 1500 = 6000 GPU-s), its 16-GPU one would
    borrow (a quota wait, 16 x 1500 = 24000 GPU-s)."""
    d = driver({"a": 8, "b": 8}, node_count=2)
    for wid in ("a1", "a2"):
        d.submit(submission(wid, "a", 8, "exploratory"), 0)
    d.tick(0)
    assert d.tally.team_gpus() == {"a": TeamGpus(8, 16, 8), "b": TeamGpus(8, 0, 0)}
    d.submit(submission("b-small", "b", 4, "training"), 1800)
    d.submit(submission("b-big", "b", 16, "training"), 1800)  # one 16-GPU bundle: never fits a node
    d.tick(HOUR)
    fairness = d.tally.fairness(HOUR + 1)
    assert fairness["hour_start"] == 0.0
    teams = fairness["teams"]
    assert teams["a"]["share_ratio_1h"] == pytest.approx(4 / 3)
    assert teams["b"]["share_ratio_1h"] == 0.0
    assert fairness["jain_1h"] == pytest.approx(0.5) == pytest.approx(jain([4 / 3, 0.0]))
    assert teams["a"]["share_ratio_1d"] == pytest.approx(4 / 3)
    assert teams["b"]["inversion_gpu_s"] == pytest.approx(4 * 1500)
    assert teams["b"]["quota_wait_gpu_s"] == pytest.approx(16 * 1500)
    assert teams["a"]["inversion_gpu_s"] == 0.0 == teams["a"]["quota_wait_gpu_s"]
    readings = views.gauge_readings(d.state, d.tally, HOUR + 1)
    assert readings.share_ratio == {"a": pytest.approx(4 / 3), "b": 0.0}
    assert readings.jain == pytest.approx(0.5)
    assert readings.inversion_gpu_s == {"a": 0.0, "b": pytest.approx(6000)}
    # In the hour being filled, nothing is final: the gauges show the last full hour.
    assert d.tally.fairness(HOUR - 1)["jain_1h"] is None  # hour -1 had no demand at all


def test_a_team_that_asked_for_nothing_reads_a_ratio_of_one() -> None:
    d = driver({"a": 8, "b": 8}, node_count=2)
    d.submit(submission("a1", "a", 8, "exploratory"), 0)
    d.tick(0)
    d.tick(HOUR + 5)
    readings = views.gauge_readings(d.state, d.tally, HOUR + 5)
    assert readings.share_ratio == {"a": 1.0, "b": 1.0}  # a got its whole demand; b asked for none
    assert readings.jain == 1.0  # one team with a share: nothing to compare


def test_fairness_keeps_the_last_day_of_hours_only() -> None:
    d = driver({"a": 8, "b": 8}, node_count=2)
    d.submit(submission("a1", "a", 8, "exploratory"), 0)
    d.tick(0)
    for hour in range(1, 60):
        d.tick(hour * HOUR)
    shares = d.tally.timeline.shares
    assert len(shares.hourly_jain()) == 0  # one team only: no hour to compare
    assert len(shares._hours) <= 25  # the hour being filled and the last day's full hours


def b_waits_behind_a_for_half_an_hour() -> Driver:
    """a's 16 exploratory GPUs all hour; b's 4 training GPUs queued from 1800 s, the hour's end
    the first pass after: 4 GPUs x 1500 s of inversion past the 300 s bound."""
    d = driver({"a": 8, "b": 8}, node_count=2)
    for wid in ("a1", "a2"):
        d.submit(submission(wid, "a", 8, "exploratory"), 0)
    d.tick(0)
    d.submit(submission("b-small", "b", 4, "training"), 1800)
    d.tick(HOUR)
    return d


def test_status_prints_each_teams_fairness(capsys: pytest.CaptureFixture[str]) -> None:
    """`switchyard status`'s fairness block, from the scripted hour above."""
    d = b_waits_behind_a_for_half_an_hour()
    render_fairness(d.tally.fairness(HOUR + 1))
    out = capsys.readouterr().out
    assert "Jain's index last hour: 0.50" in out and "since 1970-01-01 00:00 UTC" in out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines()[4:]}
    # Second half: b asks 4 (all of it fair), a 12 of its 16: a 57600 / (16 + 12) x 1800 = 8/7.
    # b's inversion: 4 GPUs x 1500 s = 1.7 GPU-h.
    # Over the last day, and (in parentheses) since the tally started: the same here.
    assert rows == {
        "a": ["1.14", "1.14", "0.0", "(0.0)", "0.0", "(0.0)"],
        "b": ["0.00", "0.00", "1.7", "(1.7)", "0.0", "(0.0)"],
    }


def test_inversion_over_the_last_day_forgets_older_hours_while_the_total_keeps_them() -> None:
    """`status` reads inversion over the last day: b's inversion of hour 0 (4 GPUs x 1500 s)
    counts at the end of hour 0 and in the day's sum 23 hours later, and not 25 hours later;
    the total since the tally started keeps it (issue 19: it counted from the start only)."""
    d = b_waits_behind_a_for_half_an_hour()
    d.cancel("b-small", HOUR)  # nothing waits from here on
    for now, in_day in ((HOUR + 1, 6000), (23 * HOUR + 1, 6000), (25 * HOUR + 1, 0)):
        d.tick(now)
        b = d.tally.fairness(now)["teams"]["b"]
        assert b["inversion_gpu_s_1d"] == pytest.approx(in_day), now
        assert b["inversion_gpu_s"] == pytest.approx(6000), now


# ---------------------------------------------------------------------------- same as the simulator
NO_PREEMPTION = PolicyKnobs(
    Ordering.PRIORITY, PreemptionMode.NONE, borrowing=True, enforce_quota=True, backfill=True, max_reservations=0
)


def _jobs(seed: int) -> list[TraceJob]:
    rng = random.Random(seed)
    jobs = []
    for n in range(60):
        gpus = rng.choice((1, 2, 4, 8))
        priority = rng.choice(("training", "exploratory", "batch"))
        jobs.append(
            TraceJob(
                f"j{n}",
                rng.choice(("a", "b", "c")),
                float(rng.randrange(0, 6 * 3600, 60)),
                float(rng.randrange(600, 4 * 3600, 60)),
                gpus,
                submission("x", "a", 1, "training" if priority == "training" else "exploratory").workload_class,
                priority,
                None,
                (gpus,),
                PlacementStrategy.PACK,
                False,
            )
        )
    return sorted(jobs, key=lambda j: (j.submit_s, j.workload_id))


def _drive_like_the_simulator(jobs: list[TraceJob], nodes: list[Node], end_s: float, seed: int) -> Driver:
    """The simulator's events on the live driver: at each instant, finishes, then submissions,
    then one scheduling pass; a started job releases its lease (finished) after its duration."""
    d = Driver.empty(replace(policy({"a": 8, "b": 4, "c": 4}), knobs=NO_PREEMPTION), 0.0, ClaimPolicy(timeout_s=1e9))
    d.nodes_seen(nodes, 0.0)
    by_id = {j.workload_id: j for j in jobs}
    heap: list[tuple[float, int, str]] = [(j.submit_s, 1, j.workload_id) for j in jobs]
    heapq.heapify(heap)
    while heap and heap[0][0] < end_s:
        t = heap[0][0]
        while heap and heap[0][0] == t:
            _, kind, key = heapq.heappop(heap)
            if kind == 0:
                d.release(key, True, t)
            else:
                job = by_id[key]
                d.submit(
                    WorkloadSubmission(
                        workload_id=key,
                        team=job.team,
                        workload_class=job.workload_class,
                        priority_class=job.priority_class,
                        bundles=job.bundles,
                    ),
                    t,
                )
        queued_before = set(d.state.queued_since)
        d.tick(t)
        for wid in queued_before - set(d.state.queued_since):
            grant = d.lease(wid)
            assert grant is not None, f"seed {seed}: {wid} left the queue without a lease"
            heapq.heappush(heap, (t + by_id[wid].duration_s, 0, grant.lease_id))
    d.tick(end_s)
    return d


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_live_fairness_equals_the_simulators_on_the_same_events(seed: int) -> None:
    jobs = _jobs(seed)
    cluster = Cluster(gpus=16, nodes_per_group=2, nodes_per_rack=2)
    end_s = 12 * HOUR
    sim = Simulation(
        replace(policy({"a": 8, "b": 4, "c": 4}), knobs=NO_PREEMPTION), cluster, jobs, SimWindow(0.0, end_s)
    )
    trace = sim.run()
    live = _drive_like_the_simulator(jobs, cluster.nodes(), end_s, seed).tally.timeline
    assert trace.shares is not None and trace.inversions is not None
    hours = range(int(end_s // HOUR))
    assert [live.shares.hour_ratios(h) for h in hours] == [trace.shares.hour_ratios(h) for h in hours], seed
    assert live.shares.hourly_jain() == trace.shares.hourly_jain(), seed
    assert live.inversions.inversion_gpu_s == trace.inversions.inversion_gpu_s, seed
    assert live.inversions.quota_wait_gpu_s == trace.inversions.quota_wait_gpu_s, seed
    assert sum(trace.inversions.inversion_gpu_s.values()) + sum(trace.inversions.quota_wait_gpu_s.values()) > 0
    assert min(trace.shares.hourly_jain()) < 1.0  # contention: there is something to get right


# ---------------------------------------------------------------------------- counts vs a snapshot
def _from_snapshot(d: Driver, now: float) -> dict[str, object]:
    """What the gauges read before they were kept incrementally: a full snapshot each tick."""
    snap = d.state.core.snapshot(now, explain_pending=False)
    leases = {s.value: 0 for s in LeaseState}
    for lease in snap.leases:
        leases[lease.state] += 1
    return {
        "free": snap.free_gpus,
        "leased": snap.total_gpus - snap.free_gpus,
        "leases": leases,
        "queued": {t.team: t.queued for t in snap.teams},
        "team_gpus": {t.team: TeamGpus(t.guaranteed_gpus, t.used_gpus, t.borrowed_gpus) for t in snap.teams},
        "allocated": {t.team: t.used_gpus for t in snap.teams},
        "queued_gpus": {t.team: t.queued_gpus for t in snap.teams},
    }


def _from_tally(d: Driver, tally: LiveTally, now: float) -> dict[str, object]:
    r = views.gauge_readings(d.state, tally, now)
    timeline = tally.timeline
    return {
        "free": r.free_gpus,
        "leased": r.leased_gpus,
        "leases": r.leases,
        "queued": r.queued,
        "team_gpus": r.team_gpus,
        "allocated": {t: timeline.allocated.get(t, 0) for t in r.queued},
        "queued_gpus": {t: timeline.queued_gpus.get(t, 0) for t in r.queued},
    }


PRIORITIES = ("production-inference", "training", "exploratory")


def _random_step(d: Driver, rng: random.Random, now: float, n: int) -> tuple[str, list[Effect]]:
    s = d.state
    roll = rng.random()
    if roll < 0.35:
        wid = f"w{n}"
        priority = rng.choice(PRIORITIES)
        gpus = rng.choice((1, 2, 4, 8, 8)) if priority != "production-inference" else 1
        return f"submit {wid}", d.submit(submission(wid, rng.choice(("a", "b", "c")), gpus, priority), now)
    if roll < 0.45 and s.submissions:
        wid = rng.choice(sorted(set(s.queued_since) | set(s.grants)) or ["none"])
        if wid != "none":
            return f"cancel {wid}", d.cancel(wid, now)
    if roll < 0.65 and s.grants:
        wid = rng.choice(sorted(s.grants))
        grant = s.grants[wid]
        if rng.random() < 0.7:  # the rest are left for the claim timeout
            d.claim(wid, f"job-{wid}")
        return f"release {grant.lease_id}", d.release(grant.lease_id, rng.random() < 0.6, now)[1]
    if roll < 0.72:
        live = sorted(rng.sample(range(6), rng.randint(4, 6)))  # a node or two may leave, and come back
        return f"nodes {sorted(live)}", d.nodes_seen([Node(f"n{i}", 8, f"g{i // 2}", f"r{i // 2}") for i in live], now)
    if roll < 0.75 and s.grants:
        wid = rng.choice(sorted(s.grants))
        return f"checkpoint {wid}", d.checkpoint_reported(wid, now)
    return "tick", d.tick(now)


@pytest.mark.parametrize("seed", range(8))
def test_counts_kept_as_events_happen_equal_a_snapshot(seed: int) -> None:
    """Random submits, cancels, releases (finished or not), node losses and returns,
    preemptions (grace periods pass) and claim timeouts: after every event the incremental
    counts equal the snapshot's, and a tally rebuilt from the state agrees."""
    rng = random.Random(seed)
    d = driver({"a": 8, "b": 16, "c": 0}, node_count=6, claim_timeout_s=400.0)
    now = 0.0
    seen: set[str] = set()
    for n in range(300):
        now += rng.choice((1.0, 30.0, GRACE_S / 2, GRACE_S))
        step, effects = _random_step(d, rng, now, n)
        seen |= {e.kind.value for e in effects if isinstance(e, JournalEvent)}
        expected = _from_snapshot(d, now)
        assert _from_tally(d, d.tally, now) == expected, f"seed {seed}, event {n} ({step})"
        if n % 50 == 0:
            assert _from_tally(d, LiveTally.of(d.state), now) == expected, f"seed {seed}, event {n} (rebuilt)"
    # The sequence exercised what changes queues and leases in unusual ways.
    assert {"admitted", "preemption_notice", "requeued", "node_lost", "claim_timeout"} <= seen, (seed, seen)
