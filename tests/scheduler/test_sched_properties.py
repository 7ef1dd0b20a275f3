"""Property tests: random event sequences against the core's invariants."""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_support import gang, nodes, policy

from switchyard.scheduler.core import (
    Decisions,
    LeaseState,
    PlacementStrategy,
    PolicyKnobs,
    PreemptionMode,
    Scheduler,
)
from switchyard.scheduler.core.model import HoldKind, WorkloadClass
from switchyard.scheduler.sim.engine import Cluster, Simulation, SimWindow
from switchyard.scheduler.sim.trace import TraceJob
from tests.examples import examples

GUARANTEES = {"a": 8, "b": 8, "c": 8}  # 24 of 32 GPUs guaranteed; 8 unassigned
SHAPES = [(1,), (2,), (4,), (8,), (4, 4), (8, 8)]
PRIORITIES = ["production-inference", "training", "batch", "exploratory"]
MODES = [PreemptionMode.CHECKPOINT_AWARE, PreemptionMode.KUEUE, PreemptionMode.PRIORITY]

submit = st.tuples(
    st.just("submit"),
    st.sampled_from(sorted(GUARANTEES)),
    st.sampled_from(SHAPES),
    st.sampled_from(PRIORITIES),
    st.booleans(),
)
finish = st.tuples(st.just("finish"), st.integers(0, 50))
advance = st.tuples(st.just("advance"), st.sampled_from([1.0, 30.0, 200.0, 900.0]))
checkpoint = st.tuples(st.just("checkpoint"), st.integers(0, 50))
events = st.lists(st.one_of(submit, submit, finish, advance, checkpoint), min_size=5, max_size=60)


@dataclass
class Driver:
    """Plays the live driver: carries out decisions and checks invariants after each one."""

    s: Scheduler
    now: float = 0.0
    seq: int = 0
    log: list[tuple[str, ...]] = field(default_factory=list)

    def apply(self, d: Decisions) -> None:
        for start in d.starts:
            self.log.append(("start", start.lease_id, *start.placement))
        for notice in d.notices:
            self.log.append(("notice", notice.lease_id, notice.preemptor))
        # PRIORITY mode is the strict-priority baseline: no quota protection by definition
        # (policy.PreemptionMode), so the borrowing rule is checked only where it is promised.
        if self.s.policy.knobs.preemption is not PreemptionMode.PRIORITY:
            self.check_victims_were_borrowing([(n.lease_id, n.preemptor) for n in d.notices])
        for stop in d.stops:
            self.log.append(("stop", stop.lease_id))
            self.s.release(stop.lease_id, self.now, finished=stop.reason == "cancelled")
        self.check_allocation()

    def schedule(self) -> None:
        for _ in range(8):
            d = self.s.schedule(self.now)
            self.apply(d)
            if not d.stops:
                return

    def check_allocation(self) -> None:
        used: dict[str, int] = {}
        for lease in self.s.leases().values():
            assert len(lease.placement) == len(lease.request.bundles)  # all or nothing
            if lease.request.strategy is PlacementStrategy.STRICT_PACK:
                assert len(set(lease.placement)) == 1
            if lease.request.same_node_group:
                assert len({self.s.pool.node(n).node_group for n in lease.placement}) == 1
            for node, gpus in lease.gpus_by_node().items():
                used[node] = used.get(node, 0) + gpus
        for spec in self.s.pool.nodes():
            assert used.get(spec.name, 0) <= spec.gpus  # never over-allocated
            assert self.s.pool.free(spec.name) == spec.gpus - used.get(spec.name, 0)
        # The hold counts kept incrementally (for decision latency) equal a recount.
        holds = self.s._holds
        kinds, counts = holds.kinds(), holds.counts
        for kind in HoldKind:
            assert counts.of_kind(kind) == sum(1 for k in kinds.values() if k is kind)
        for team in GUARANTEES:
            assert counts.starving_of(team) == sum(
                1 for w, k in kinds.items() if k is HoldKind.STARVING and holds.team_of(w) == team
            )

    def check_victims_were_borrowing(self, notices: list[tuple[str, str]]) -> None:
        """Another team's lease is taken only while that team borrows: after one decision's
        notices, each team that lost leases to another team was still above its guarantee
        before its last victim went (a gang is taken whole, so it may end below)."""
        taken: dict[str, list[int]] = {}
        for lease_id, preemptor in notices:
            victim = self.s.leases()[lease_id]
            if preemptor.split("-")[0] != victim.request.team:  # same team: usage unchanged
                taken.setdefault(victim.request.team, []).append(victim.gpus)
        for team, sizes in taken.items():
            leaving = sum(
                x.gpus for x in self.s.leases().values() if x.request.team == team and x.state is LeaseState.PREEMPTING
            )
            arriving = sum(sum(r.values()) for w, r in self.s.reservations().items() if w.split("-")[0] == team)
            assert self.s.team_usage(team) - leaving + max(sizes) + arriving > GUARANTEES[team]


def replay(ops: list[tuple[object, ...]], mode: PreemptionMode) -> list[tuple[str, ...]]:
    driver = Driver(Scheduler(policy(GUARANTEES, PolicyKnobs(preemption=mode)), nodes(4)))
    for op in ops:
        if op[0] == "submit":
            _, team, shape, priority, ckpt = op
            assert isinstance(shape, tuple)
            driver.seq += 1
            request = gang(
                f"{team}-{driver.seq}",
                str(team),
                shape,
                str(priority),
                checkpoint_s=300.0 if ckpt else None,
                same_group=len(shape) > 1,
            )
            driver.s.submit(request, driver.now)
        elif op[0] == "finish":
            lease_ids = sorted(driver.s.leases())
            if lease_ids:
                index = int(op[1]) % len(lease_ids)  # type: ignore[call-overload,unused-ignore]
                driver.s.release(lease_ids[index], driver.now, finished=True)
        elif op[0] == "checkpoint":
            leases = sorted(driver.s.leases().values(), key=lambda x: x.lease_id)
            if leases:
                pick = leases[int(op[1]) % len(leases)]  # type: ignore[call-overload]
                driver.s.report_checkpoint(pick.request.workload_id, driver.now)
        else:
            driver.now += float(op[1])  # type: ignore[arg-type]
        driver.schedule()
    return driver.log


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(events, st.sampled_from(MODES))
def test_invariants_hold_for_any_event_sequence(ops: list[tuple[object, ...]], mode: PreemptionMode) -> None:
    replay(ops, mode)


@settings(max_examples=examples(15), deadline=None)
@given(events)
def test_same_events_give_the_same_schedule(ops: list[tuple[object, ...]]) -> None:
    assert replay(ops, PreemptionMode.CHECKPOINT_AWARE) == replay(ops, PreemptionMode.CHECKPOINT_AWARE)


@settings(max_examples=examples(40), deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from(sorted(GUARANTEES)), st.sampled_from(PRIORITIES[1:])), min_size=1, max_size=80)
)
def test_a_team_below_its_guarantee_gets_it_back(asks: list[tuple[str, str]]) -> None:
    """Single-GPU work: whatever others borrowed, a team's guarantee is returned within one grace."""
    driver = Driver(Scheduler(policy(GUARANTEES), nodes(4)))
    for i, (team, priority) in enumerate(asks):
        driver.s.submit(gang(f"{team}-{i}", team, (1,), priority), driver.now)
        driver.schedule()
    driver.now += PolicyKnobs().preemption_grace_s + 1
    driver.schedule()
    driver.schedule()
    for team, guarantee in GUARANTEES.items():
        asked = sum(1 for t, _ in asks if t == team)
        assert driver.s.team_usage(team) >= min(asked, guarantee)


@settings(max_examples=examples(10), deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(sorted(GUARANTEES)), st.sampled_from([1, 2, 4, 8, 16]), st.integers(60, 7200)),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([*MODES, PreemptionMode.NONE]),
)
def test_no_starvation_under_bounded_load(jobs: list[tuple[str, int, int]], mode: PreemptionMode) -> None:
    """Jobs arriving at under 1/2 of capacity on average all finish (none waits forever)."""
    trace = []
    t = 0.0
    for i, (team, gpus, duration) in enumerate(jobs):
        t += 2 * gpus * duration / 32  # spacing keeps the offered load at 1/2
        bundles = (8,) * (gpus // 8) if gpus > 8 else (gpus,)
        trace.append(
            TraceJob(
                f"{team}-{i}",
                team,
                t,
                float(duration),
                gpus,
                WorkloadClass.TRAINING,
                "training",
                600.0,
                bundles,
                PlacementStrategy.PACK,
                len(bundles) > 1,
            )
        )
    window = SimWindow(0.0, t + 1, tail_s=10 * 86400)
    result = Simulation(
        policy(GUARANTEES, PolicyKnobs(preemption=mode)), Cluster(32, nodes_per_group=2), trace, window
    ).run()
    assert all(r.finish_s is not None for r in result.jobs)
