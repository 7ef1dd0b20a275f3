"""The inference pool's decision logic without Ray: Serve replicas against the core's workloads,
the reconciler on a real core and journal, the cause chain, and the quota-derived bounds."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from switchyard.cluster.grant_holds import SERVE_GPU_RESOURCE
from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.serve_configs import (
    app_team,
    check_team_configs,
    inference_gpu_limit,
    load_configs,
    max_replicas,
    merge_team_configs,
)
from switchyard.cluster.serve_pool import (
    Adopt,
    Cancel,
    Release,
    Running,
    ServePool,
    ServeReplica,
    Submit,
    Unowned,
    plan,
    reclaim_chains,
    replica_from_actor,
)
from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    GangRequest,
    Node,
    Quota,
    Scheduler,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)
from switchyard.scheduler.core.config import load_policy_file
from switchyard.scheduler.driver import Driver, LiveState, inputs
from switchyard.scheduler.driver.effects import JournalEvent
from switchyard.scheduler.driver.serve_replicas import ReplicaChange

REPO = Path(__file__).resolve().parents[2]
TEAMS = {"prod", "inference"}


def replica(uid: str, node: str | None, app: str = "prod--echo", gpus: int = 1) -> ServeReplica:
    return ServeReplica(app, "echo", uid, gpus, node)


def test_plan_queues_waiting_replicas_and_adopts_placed_ones() -> None:
    waiting, placed = replica("a", None), replica("b", "n1")
    actions = plan([waiting, placed], {}, TEAMS)
    assert actions == [Adopt(placed, "prod", "n1"), Submit(waiting, "prod")]
    # Next round the core holds both: nothing to do but confirm the running one.
    held = {waiting.workload_id: None, placed.workload_id: ("n1",)}
    assert plan([waiting, placed], held, TEAMS) == [Running(placed, "n1")]


def test_plan_lets_a_starting_replica_show_where_ray_put_it() -> None:
    # Waiting for the first time: most are a worker starting on GPUs Ray already gave them.
    starting = replica("a", None)
    assert plan([starting], {}, TEAMS, starting={starting.workload_id}) == []
    assert plan([starting], {}, TEAMS) == [Submit(starting, "prod")]


def test_plan_follows_ray_where_it_differs_from_the_grant() -> None:
    r = replica("a", "n2")
    # Granted n1, but Ray put it on n2: give n1 back first, then lease n2.
    assert plan([r], {r.workload_id: ("n1",)}, TEAMS) == [
        Release(r.workload_id, "granted ['n1'], Ray placed it on n2"),
        Adopt(r, "prod", "n2"),
    ]
    # Still queued when Ray placed it (the GPU freed before the core's next tick): adopt it.
    assert plan([r], {r.workload_id: None}, TEAMS) == [Adopt(r, "prod", "n2")]
    # Granted and Ray has not placed it yet: wait.
    assert plan([replica("a", None)], {r.workload_id: ("n1",)}, TEAMS) == []


def test_plan_releases_what_went_away_and_ignores_cpu_replicas() -> None:
    gone_leased, gone_queued = replica("x", "n1"), replica("y", None)
    held = {gone_leased.workload_id: ("n1",), gone_queued.workload_id: None}
    cpu = replica("c", "n1", gpus=0)
    placed = replica("p", "n1")
    actions = plan([cpu, placed], held, TEAMS)
    assert actions == [
        Release(gone_leased.workload_id, "replica gone"),
        Cancel(gone_queued.workload_id, "replica gone"),
        Adopt(placed, "prod", "n1"),
    ]


def test_plan_reports_replicas_of_no_team_with_an_inference_quota() -> None:
    nameless, no_quota = replica("a", "n1", app="echo"), replica("b", None, app="research--chat")
    actions = plan([nameless, no_quota], {}, TEAMS)
    assert [type(a) for a in actions] == [Unowned, Unowned]
    assert "name it '<team>--<app>'" in actions[0].reason  # type: ignore[union-attr]
    assert "team 'research' has no inference quota" in actions[1].reason  # type: ignore[union-attr]
    assert app_team("gateway") == "inference"  # the platform's own app: its local model
    assert app_team("vision--tagger") == "vision" and app_team("--x") is None and app_team("vision--") is None


def _actor(**kw: Any) -> SimpleNamespace:
    row = {
        "class_name": "ServeReplica:prod--echo:echo",
        "name": "SERVE_REPLICA::prod--echo#echo#u1",
        "state": "ALIVE",
        "node_id": "n1",
        "required_resources": {"GPU": 1.0, "CPU": 0.0},
    }
    row.update(kw)
    return SimpleNamespace(**row)


def test_replicas_from_rays_actor_table() -> None:
    assert replica_from_actor(_actor()) == ServeReplica("prod--echo", "echo", "u1", 1, "n1", slots=0)
    slotted = _actor(required_resources={"GPU": 2.0, SERVE_GPU_RESOURCE: 2.0})
    assert replica_from_actor(slotted) == ServeReplica("prod--echo", "echo", "u1", 2, "n1", slots=2)
    assert replica_from_actor(_actor()).replica_id == "SERVE_REPLICA::prod--echo#echo#u1"  # type: ignore[union-attr]
    assert replica_from_actor(_actor(state="PENDING_CREATION", node_id=None)).node_id is None  # type: ignore[union-attr]
    assert replica_from_actor(_actor(state="RESTARTING")).node_id is None  # type: ignore[union-attr]
    assert replica_from_actor(_actor(state="DEAD")) is None
    assert replica_from_actor(_actor(class_name="ServeController")) is None
    assert replica_from_actor(_actor(required_resources={"GPU": 0.5})).gpus == 1  # type: ignore[union-attr]


def logged(driver: Driver, journal: SchedulerJournal, now: float) -> Callable[[list[ReplicaChange]], Mapping[str, str]]:
    """What the actor does with the pool's changes: one driver event, its rows journaled."""

    def apply(changes: list[ReplicaChange]) -> Mapping[str, str]:
        refused, effects = inputs.apply(driver, inputs.serve_replicas(changes, now))
        for e in effects:
            if isinstance(e, JournalEvent):
                journal.event(e.kind.value, e.workload_id, e.team, e.at, **e.details)
        assert isinstance(refused, dict)
        return refused

    return apply


def test_gpu_replicas_without_serve_slots_are_reported(tmp_path: Path) -> None:
    policy = _policy()
    node = Node("n1", 8, "a", "r")
    state = LiveState(Scheduler(policy, (node,), 0), nodes={"n1": node})
    d, journal = Driver(state), SchedulerJournal(tmp_path / "scheduler.db")
    pool = ServePool(policy, journal)
    held = replica_from_actor(_actor(required_resources={"GPU": 1.0, SERVE_GPU_RESOURCE: 1.0}))
    bare = replica_from_actor(_actor(name="SERVE_REPLICA::prod--echo#echo#u2"))
    assert held is not None and bare is not None
    pool.reconcile(state, [held, bare], 0, logged(d, journal, 0))
    assert pool.report(state, 0)["without_serve_slots"] == [bare.replica_id]
    pool.reconcile(state, [held], 1, logged(d, journal, 1))
    assert pool.report(state, 1)["without_serve_slots"] == []


def _policy() -> SchedulerPolicy:
    inference = Quota(frozenset({WorkloadClass.INFERENCE}), 4, borrowing_limit_gpus=0)
    training = Quota(frozenset(set(WorkloadClass) - {WorkloadClass.INFERENCE}), 4)
    return SchedulerPolicy(
        DEFAULT_PRIORITY_CLASSES, (Team("prod", (inference,), 4.0), Team("research", (training,), 4.0))
    )


def test_reconciler_on_a_real_core(tmp_path: Path) -> None:
    policy = _policy()
    node = Node("n1", 8, "a", "r")
    state = LiveState(Scheduler(policy, (node,), 0), nodes={"n1": node})
    journal = SchedulerJournal(tmp_path / "scheduler.db")
    pool = ServePool(policy, journal)
    d = Driver(state)
    core = state.core
    for wid in ("own", "borrower"):  # research fills the node, borrowing prod's idle guarantee
        core.submit(GangRequest(wid, "research", WorkloadClass.TRAINING, "training", (4,)), 0)
    leases = {s.workload_id: s for s in core.schedule(0).starts}

    # A replica Ray placed on GPUs the ledger gave to training is reported, not adopted.
    squatter = replica("s", "n1")
    assert pool.reconcile(state, [squatter], 0, logged(d, journal, 0), d.generation) is True  # asked once
    report = pool.report(state, 0)
    assert report["leased"] == [] and "0 GPUs free in the ledger" in report["outside_lease"][0]["reason"]
    assert squatter.workload_id not in state.submissions and core.lease_of(squatter.workload_id) is None
    # Nothing happened since: not asked again (no event logged every refresh), still reported.
    assert pool.reconcile(state, [squatter], 0.5, logged(d, journal, 0.5), d.generation) is False
    assert "0 GPUs free in the ledger" in pool.report(state, 0.5)["outside_lease"][0]["reason"]

    # A waiting replica is queued; the core reclaims the borrowed GPUs for it.
    waiting = replica("w", None)
    first_seen = 2 - pool.SETTLE_S  # first seen: maybe starting
    assert pool.reconcile(state, [waiting], first_seen, logged(d, journal, first_seen)) is False
    assert pool.reconcile(state, [waiting], 2, logged(d, journal, 2)) is True
    decisions = core.schedule(2)
    assert [(n.workload_id, n.preemptor) for n in decisions.notices] == [("borrower", waiting.workload_id)]
    pool.record(state, decisions, 2)
    assert pool.report(state, 2)["pending"][0]["reserved"] == {"n1": 1}

    # The borrower checkpoints and releases; Ray places the replica before the core's next tick.
    core.release(leases["borrower"].lease_id, 3)
    placed = replica("w", "n1")
    assert pool.reconcile(state, [placed], 3, logged(d, journal, 3)) is True
    assert state.grants[placed.workload_id].placements[0].node_id == "n1"
    assert core.lease_of(placed.workload_id) is not None
    kinds = [e["kind"] for e in journal.events(placed.workload_id)]
    assert kinds == ["replica_pending", "reclaim_decision", "adopted", "replica_running"]
    decision = journal.events(placed.workload_id)[1]
    assert decision["victims"][0]["workload_id"] == "borrower" and decision["victims"][0]["reason"] == "reclaim"

    # Scaled down: the replica goes away and its GPU goes back.
    assert pool.reconcile(state, [], 4, logged(d, journal, 4)) is True
    assert core.lease_of(placed.workload_id) is None and placed.workload_id not in state.submissions
    assert core.pool.free("n1") == 4


def _event(seq: int, kind: str, wid: str, **kw: Any) -> dict[str, Any]:
    return {"seq": seq, "at": float(seq), "kind": kind, "workload_id": wid, "team": "", **kw}


def test_reclaim_chain_from_the_event_log() -> None:
    r, v, other = "serve:prod--echo/echo/u1", "train-1", "train-2"
    events = [
        _event(1, "admitted", v),
        _event(2, "replica_pending", r, replica="SERVE_REPLICA::prod--echo#echo#u1"),
        _event(3, "reclaim_decision", r, victims=[{"workload_id": v}], replica="SERVE_REPLICA::prod--echo#echo#u1"),
        _event(4, "preemption_notice", v, preemptor=r),
        _event(5, "preemption_notice", other, preemptor="someone-else"),
        _event(6, "requeued", other),
        _event(7, "requeued", v),
        _event(8, "admitted", r),
        _event(9, "replica_running", r),
    ]
    (chain,) = reclaim_chains(reversed(events))
    assert [s["seq"] for s in chain["steps"]] == [2, 3, 4, 7, 8, 9]
    assert chain["complete"] is True and chain["victims"] == [v] and chain["pending_to_running_s"] == 7.0
    (unfinished,) = reclaim_chains(events[:5])
    assert unfinished["complete"] is False and unfinished["pending_to_running_s"] is None


def test_max_replicas_follow_the_inference_quota() -> None:
    policy = load_policy_file(REPO / "policies" / "scheduler.yaml").to_policy()
    guarantee = policy.team("inference").guaranteed_gpus
    assert inference_gpu_limit(policy, "inference") == guarantee  # production inference never borrows
    assert max_replicas(policy, "inference", 1) == guarantee
    assert max_replicas(policy, "inference", 2) == guarantee // 2
    with pytest.raises(ValueError, match="holds no replica of 8 GPUs"):
        max_replicas(policy, "inference", 8)
    with pytest.raises(ValueError, match="has no quota for workload class inference"):
        max_replicas(policy, "research", 1)
    with pytest.raises(ValueError, match="positive whole number"):
        max_replicas(policy, "inference", 0)


def test_local_model_is_bounded_by_the_inference_quota() -> None:
    from serve_apps.local_model import gpu_options
    from switchyard.cluster.deploy import local_model_args

    args = local_model_args(REPO / "policies", 1)
    policy = load_policy_file(REPO / "policies" / "scheduler.yaml").to_policy()
    assert args == {"local_model_gpus": "1", "local_model_max_replicas": str(max_replicas(policy, "inference", 1))}
    options = gpu_options(args)
    assert options["ray_actor_options"]["num_gpus"] == 1
    assert options["autoscaling_config"]["max_replicas"] == int(args["local_model_max_replicas"])
    assert local_model_args(REPO / "policies", 0) == {} and gpu_options({}) == {}
    with pytest.raises(ValueError, match="needs local_model_max_replicas"):
        gpu_options({"local_model_gpus": "1"})
    floor = gpu_options({**args, "local_model_min_replicas": "2"})["autoscaling_config"]
    assert floor["min_replicas"] == floor["initial_replicas"] == 2
    with pytest.raises(ValueError, match="local_model_min_replicas must be between 1 and"):
        gpu_options({**args, "local_model_min_replicas": "9"})


def test_teams_serve_configs_stay_within_their_quotas(tmp_path: Path) -> None:
    from ray.serve.schema import ServeDeploySchema

    policy = load_policy_file(REPO / "policies" / "scheduler.yaml").to_policy()
    shipped = sorted((REPO / "serve_apps" / "configs").glob("*.yaml"))
    assert shipped, "an example team config ships in serve_apps/configs/"
    merged = merge_team_configs(shipped, policy)
    ServeDeploySchema.model_validate(merged)  # what `serve deploy` accepts
    # Every GPU deployment asks for as many Serve slots as GPUs: grants hold those (`grant_holds`).
    gpu_options = [
        d["ray_actor_options"]
        for a in merged["applications"]
        for d in a.get("deployments") or []
        if (d.get("ray_actor_options") or {}).get("num_gpus")
    ]
    assert gpu_options and all(o["resources"][SERVE_GPU_RESOURCE] == o["num_gpus"] for o in gpu_options)
    assert all(app_team(a["name"]) == Path(p).stem for p in shipped for a in load_configs([p])[str(p)]["applications"])

    greedy = {
        "applications": [
            {
                "name": "vision--big",
                "deployments": [
                    {"name": "d", "ray_actor_options": {"num_gpus": 1}, "autoscaling_config": {"max_replicas": 5}}
                ],
            },
            {"name": "speech--x", "deployments": []},
            {"name": "nameless", "deployments": []},
            {
                "name": "vision--auto",
                "deployments": [{"name": "d", "ray_actor_options": {"num_gpus": 1}, "num_replicas": "auto"}],
            },
        ]
    }
    problems = check_team_configs({"configs/vision.yaml": greedy}, policy)
    assert any("team 'vision': its GPU deployments may hold 5 GPUs" in p for p in problems)
    assert any("belongs to team 'speech', not to this file's 'vision'" in p for p in problems)
    assert any("team 'speech' has no inference quota" in p for p in problems)
    assert any("app 'nameless' must be named '<team>--<app>'" in p for p in problems)
    assert any("states its replicas" in p for p in problems)
    (tmp_path / "vision.yaml").write_text(yaml.safe_dump(greedy))
    with pytest.raises(ValueError, match="may hold 5 GPUs"):
        merge_team_configs([tmp_path / "vision.yaml"], policy)


def test_a_placed_replica_takes_the_grant_of_a_waiting_one_of_its_deployment() -> None:
    """Ray chose which of two waiting replicas got the freed GPU: not the one the core granted.
    The grant moves to the placed replica; the granted one is released and queues again."""
    granted, placed = replica("g", None), replica("p", "n1")
    held = {granted.workload_id: ("n1",), placed.workload_id: None}
    actions = plan([granted, placed], held, TEAMS)
    assert actions[0] == Release(granted.workload_id, f"Ray placed {placed.replica_id} on its GPU first; waits again")
    assert actions[1:] == [Adopt(placed, "prod", "n1")]
    # Another deployment's grant is never taken.
    other = ServeReplica("prod--other", "echo", "o", 1, None)
    actions = plan([other, placed], {other.workload_id: ("n1",), placed.workload_id: None}, TEAMS)
    assert actions == [Adopt(placed, "prod", "n1")]


def test_a_serve_name_a_workload_id_cannot_carry_is_queued_by_digest(tmp_path: Path) -> None:
    """Serve refuses only `#` in a name; the scheduler refuses a workload id with a control
    character or more than 256 characters (stop 47). A replica of such a deployment is queued
    under a digest of its name, beside the others."""
    policy = _policy()
    node = Node("n1", 8, "a", "r")
    state = LiveState(Scheduler(policy, (node,), 0), nodes={"n1": node})
    d, journal = Driver(state), SchedulerJournal(tmp_path / "scheduler.db")
    pool = ServePool(policy, journal)
    odd = [replica("u1", None, app="prod--echo\nx"), ServeReplica("prod--echo", "e" * 5000, "u2", 1, None)]
    waiting = [*odd, replica("u3", None)]
    assert len({r.workload_id for r in waiting}) == 3
    pool.reconcile(state, waiting, -pool.SETTLE_S, logged(d, journal, -pool.SETTLE_S))
    assert pool.reconcile(state, waiting, 0, logged(d, journal, 0)) is True
    assert {r.workload_id for r in waiting} <= set(state.submissions)
    assert all(r.workload_id.startswith("serve:sha256-") for r in odd)
