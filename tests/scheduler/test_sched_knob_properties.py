"""The core's invariants under every knob an operator may set, and its state through a snapshot.

`test_sched_properties` generates events under the default knobs. The knobs that are off by
default (escalation, starving reservations per team, the team order, Kueue's order, fair-share
reclaim, no backfill) are promised to an operator who turns them on, so here each example
draws a knob setting as well as the events, with the priority classes of
`bench/philly_scheduler.yaml` (minimum runtimes, backoff, the preemption cap), on either a
flat policy or the two-type, two-level cohort tree of `cohort_support`. After every
decision: no GPU is double-booked, the incremental hold books equal a recount, a
non-preemptible lease is never noticed, a team without borrowing stays within its guarantee,
every cohort and per-type limit holds (tree), and every pending workload has an explanation.
At a drawn point the core goes through the live scheduler's snapshot codec
(`core.state_codec`, JSON and back), and the restored copy must decide exactly as the
original does for the rest of the events. A failure prints the drawn knobs and event seed.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field, replace
from pathlib import Path

from cohort_support import check_invariants, tree_nodes, tree_policy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sched_support import gang, nodes

from switchyard.scheduler.core import Decisions, PolicyKnobs, PreemptionMode, Quota, Scheduler, SchedulerPolicy, Team
from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.core.model import HoldKind, WorkloadClass
from switchyard.scheduler.core.policy import Ordering, PriorityClass
from switchyard.scheduler.core.state_codec import decode_state, encode_state
from tests.examples import examples

POLICY_FILE = Path(__file__).resolve().parents[2] / "bench" / "philly_scheduler.yaml"
CLASSES = load_policy_file(POLICY_FILE).to_policy().priority_classes
PRIORITIES = [c.name for c in CLASSES]
INFERENCE_CLASS = next(c.name for c in CLASSES if not c.preemptible)
GUARANTEES = {"a": 8, "b": 8, "c": 4, "inf": 8}  # the flat policy's teams, inference last
TYPE_LISTS = [("h100", "a100"), ("a100", "h100"), ("h100",), ()]  # a request's GPU types, tree policy
SHAPES = [(1,), (2,), (4,), (8,), (4, 4), (8, 8), (8, 8, 8)]

knob_settings = st.fixed_dictionaries(
    {
        "ordering": st.sampled_from(list(Ordering)),
        "preemption": st.sampled_from(list(PreemptionMode)),
        "borrowing": st.booleans(),
        "backfill": st.booleans(),
        "max_reservations": st.integers(0, 2),
        "reservation_move_gpus": st.sampled_from([None, 1, 4]),
        "preemption_grace_s": st.sampled_from([0.0, 120.0]),
        "max_preemption_attempts": st.integers(0, 4),
        "starvation_after_s": st.sampled_from([None, 600.0, 3600.0]),
        "starving_reservations_per_team": st.integers(0, 2),
        "starving_blocks_team": st.booleans(),
        "escalate": st.booleans(),
        "preemption_retry_s": st.sampled_from([0.0, 60.0]),
        "nominal_first": st.booleans(),
        "fair_share_reclaim": st.booleans(),
        "fair_share_reclaim_multi_node_only": st.booleans(),
    }
)


def knobs_of(drawn: dict[str, object]) -> PolicyKnobs:
    """The drawn setting as valid knobs: escalation needs aging, and comes after it."""
    values = dict(drawn)
    escalate = values.pop("escalate")
    aging = values["starvation_after_s"]
    values["starvation_preempt_after_s"] = 2 * aging if escalate and isinstance(aging, float) else None
    return replace(PolicyKnobs(), **values)  # type: ignore[arg-type]


def generated_events(seed: int) -> list[tuple[object, ...]]:
    """A seeded event sequence busy enough to fill the cluster, queue gangs and preempt."""
    rng = random.Random(seed)
    ops: list[tuple[object, ...]] = []
    for _ in range(rng.randint(30, 120)):
        roll = rng.random()
        if roll < 0.5:
            ops.append(
                (
                    "submit",
                    rng.randrange(4),
                    rng.choice(SHAPES),
                    rng.choice(PRIORITIES),
                    rng.random() < 0.5,
                    rng.randrange(4),
                )
            )
        elif roll < 0.62:
            ops.append(("finish", rng.randrange(50)))
        elif roll < 0.67:
            ops.append(("cancel", rng.randrange(50)))
        elif roll < 0.75:
            ops.append(("checkpoint", rng.randrange(50)))
        else:
            ops.append(("advance", rng.choice([1.0, 60.0, 300.0, 900.0, 4000.0])))
    return ops


@dataclass
class Replay:
    """Carries out a core's decisions as the live driver does, checking invariants after each."""

    s: Scheduler
    tree: bool
    now: float = 0.0
    seq: int = 0
    log: list[tuple[object, ...]] = field(default_factory=list)

    def step(self, op: tuple[object, ...]) -> None:
        kind = op[0]
        if kind == "submit":
            _, which, shape, priority, ckpt, types = op
            teams = self.s.policy.teams
            team = teams[int(which) % len(teams)]  # type: ignore[call-overload]
            if WorkloadClass.INFERENCE in team.quotas[0].classes:
                shape, priority = (1,), INFERENCE_CLASS
            elif priority == INFERENCE_CLASS:
                priority = PRIORITIES[1]  # inference is the inference team's alone
            self.seq += 1
            request = gang(
                f"{team.name}-{self.seq}",
                team.name,
                shape,  # type: ignore[arg-type]
                str(priority),
                checkpoint_s=300.0 if ckpt else None,
                same_group=len(shape) > 1,  # type: ignore[arg-type]
            )
            if self.tree and priority != INFERENCE_CLASS:
                request = replace(request, gpu_types=TYPE_LISTS[int(types)])  # type: ignore[call-overload]
            self.s.submit(request, self.now)
        elif kind == "finish":
            lease_ids = sorted(self.s.leases())
            if lease_ids:
                self.s.release(lease_ids[int(op[1]) % len(lease_ids)], self.now, finished=True)  # type: ignore[call-overload]
        elif kind == "cancel":
            queued = sorted(p.request.workload_id for p in self.s.pending())
            if queued:
                self.s.cancel(queued[int(op[1]) % len(queued)], self.now)  # type: ignore[call-overload]
        elif kind == "checkpoint":
            leases = sorted(self.s.leases().values(), key=lambda x: x.lease_id)
            if leases:
                pick = leases[int(op[1]) % len(leases)]  # type: ignore[call-overload]
                self.s.report_checkpoint(pick.request.workload_id, self.now)
        else:
            self.now += float(op[1])  # type: ignore[arg-type]
        for _ in range(8):
            decisions = self.s.schedule(self.now)
            self.apply(decisions)
            if not decisions.stops:
                break

    def apply(self, d: Decisions) -> None:
        for start in d.starts:
            self.log.append(("start", self.now, start.lease_id, *start.placement))
        for notice in d.notices:
            lease = self.s.leases()[notice.lease_id]
            assert self.s.policy.priority(lease.request.priority_class).preemptible, (
                f"non-preemptible lease {notice.lease_id} noticed for {notice.preemptor}"
            )
            self.log.append(("notice", self.now, notice.lease_id, notice.preemptor))
        for stop in d.stops:
            self.log.append(("stop", self.now, stop.lease_id, stop.reason))
            self.s.release(stop.lease_id, self.now, finished=stop.reason == "cancelled")
        self.log.append(("holds", tuple(sorted((r.workload_id, r.gpus_by_node, r.kind.value) for r in d.reservations))))
        self.check()

    def check(self) -> None:
        s = self.s
        used: dict[str, int] = {}
        for lease in s.leases().values():
            assert len(lease.placement) == len(lease.request.bundles)
            if lease.request.same_node_group:
                assert len({s.pool.node(n).node_group for n in lease.placement}) == 1
            for node, gpus in lease.gpus_by_node().items():
                used[node] = used.get(node, 0) + gpus
        for spec in s.pool.nodes():
            assert used.get(spec.name, 0) <= spec.gpus, f"{spec.name} double-booked"
            assert s.pool.free(spec.name) == spec.gpus - used.get(spec.name, 0)
        holds = s._holds
        held: dict[str, int] = {}
        for amounts in holds.amounts().values():
            for node, gpus in amounts.items():
                held[node] = held.get(node, 0) + gpus
        cordoned = {n: s.pool.node(n).gpus for n in s.pool.cordoned()}
        for node, gpus in cordoned.items():
            held[node] = held.get(node, 0) + gpus
        assert holds.per_node == held, "per-node holds differ from a recount"
        held_free = sum(min(s.pool.free(n), g) for n, g in held.items())
        assert holds.open_gpus() == s.pool.free_gpus - held_free, "open GPUs differ from a recount"
        kinds = holds.kinds()
        for kind in HoldKind:
            assert holds.counts.of_kind(kind) == sum(1 for k in kinds.values() if k is kind)
        if not s.policy.knobs.borrowing:
            for team in s.policy.teams:
                guarantee = sum(q.guaranteed_gpus for q in team.quotas)
                used = s.team_usage(team.name)
                assert used <= guarantee, f"{team.name} uses {used} > {guarantee} GPUs without borrowing"
        if self.tree:
            check_invariants(s, -1)  # cohort limits, per-type quotas, leases on their types
        for pending in s.pending():
            assert s.explain_pending(pending, self.now).reason, f"{pending.request.workload_id} has no reason"


def classes_of(protected: bool) -> tuple[PriorityClass, ...]:
    """The file's classes, or (not `protected`) the same without minimum runtimes and backoff:
    preemption then happens often enough for the snapshot to carry notices in flight."""
    if protected:
        return CLASSES
    return tuple(
        replace(c, min_runtime_s=0.0, reclaim_min_runtime_s=0.0, preemption_backoff_s=0.0, max_preemption_backoff_s=0.0)
        for c in CLASSES
    )


def flat_policy(knobs: PolicyKnobs, classes: tuple[PriorityClass, ...]) -> SchedulerPolicy:
    """Four teams, no cohorts, one GPU type: 28 of 40 GPUs guaranteed."""
    inference = frozenset({WorkloadClass.INFERENCE})
    research = frozenset(WorkloadClass) - inference
    teams = tuple(Team(t, (Quota(inference if t == "inf" else research, g),), float(g)) for t, g in GUARANTEES.items())
    return SchedulerPolicy(classes, teams, knobs)


def core(knobs: PolicyKnobs, protected: bool, tree: bool) -> Scheduler:
    classes = classes_of(protected)
    if tree:
        return Scheduler(tree_policy(knobs, classes), tree_nodes())
    return Scheduler(flat_policy(knobs, classes), nodes(5))


def restored(s: Scheduler) -> Scheduler:
    copy = decode_state(json.loads(json.dumps(encode_state(s))))
    assert isinstance(copy, Scheduler)
    return copy


@settings(max_examples=examples(60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(knob_settings, st.booleans(), st.booleans(), st.integers(0, 2**31), st.floats(0.0, 1.0))
def test_invariants_and_snapshots_hold_under_any_knobs(
    drawn: dict[str, object], protected: bool, tree: bool, seed: int, cut: float
) -> None:
    ops = generated_events(seed)
    original = Replay(core(knobs_of(drawn), protected, tree), tree)
    split = int(len(ops) * cut)
    for op in ops[:split]:
        original.step(op)
    copy = Replay(restored(original.s), tree, original.now, original.seq)
    for op in ops[split:]:
        original.step(op)
        copy.step(op)
    assert copy.log == original.log[len(original.log) - len(copy.log) :], (
        f"the core restored from its snapshot after {split} events decided otherwise"
    )
