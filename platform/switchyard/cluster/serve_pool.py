"""Serve's GPU replicas as inference workloads of the scheduler (the inference pool).

Serve places its replicas itself: each replica is a Ray actor asking for GPUs, and Ray puts it
on any node with room. The scheduler stays the authority over those GPUs by keeping one
workload per GPU replica in the policy core (team from the app name, see `serve_configs`;
class `inference`; priority `production-inference`; one bundle of the replica's GPUs):

- a replica Ray has placed is *adopted*: a lease on the node where it runs, allowed only onto
  GPUs free in the core's ledger and within the team's inference quota;
- a replica waiting for resources is *queued*: the core grants it free GPUs or reclaims GPUs
  that training borrowed from the inference guarantee (notice -> checkpoint -> release), and
  holds the freed GPUs for it so that no training job can take them;
- a replica that went away releases its workload.

`plan` is that decision, pure: Ray's replicas against the core's pool workloads in, actions
out. `ServePool` reads Ray's state API, turns the actions that change the core into
`ReplicaChange`s, which the actor logs as one driver event (`Driver.serve_replicas`: replayed
from the write-ahead log like every other event), and journals the cause chain of each reclaim
(`reclaim_chains`). See docs/live_scheduler.md, "Serve in the inference pool".
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ray.util.metrics import Gauge

from switchyard.cluster.grant_holds import SERVE_GPU_RESOURCE
from switchyard.cluster.scheduler_journal import SchedulerJournal
from switchyard.cluster.serve_configs import INFERENCE_PRIORITY, TEAM_SEPARATOR, app_team, inference_teams
from switchyard.scheduler.api import MAX_DESCRIPTION_CHARS, MAX_WORKLOAD_ID_CHARS, WorkloadSubmission
from switchyard.scheduler.core import Decisions, SchedulerPolicy, WorkloadClass
from switchyard.scheduler.driver import LiveState
from switchyard.scheduler.driver.serve_replicas import ReplicaAction, ReplicaChange

log = logging.getLogger(__name__)

REPLICA_CLASS_PREFIX = "ServeReplica:"  # Serve's replica actor class: ServeReplica:<app>:<deployment>
REPLICA_NAME_PREFIX = "SERVE_REPLICA::"  # its actor name: SERVE_REPLICA::<app>#<deployment>#<unique id>
WORKLOAD_PREFIX = "serve:"
WAITING_STATES = frozenset({"PENDING_CREATION", "RESTARTING", "DEPENDENCIES_UNREADY"})


@dataclass(frozen=True, slots=True)
class ServeReplica:
    """One Serve replica as Ray reports it."""

    app: str
    deployment: str
    unique_id: str
    gpus: int
    node_id: str | None
    """The node Ray placed it on; None while it waits for resources."""
    slots: int | None = None
    """The Serve slots it asks for (`grant_holds`); fewer than its GPUs: nothing keeps it off
    GPUs granted to a starting job. None: not known."""

    @property
    def replica_id(self) -> str:
        return f"{REPLICA_NAME_PREFIX}{self.app}#{self.deployment}#{self.unique_id}"

    @property
    def workload_id(self) -> str:
        """`serve:<app>/<deployment>/<unique id>`. A name the scheduler refuses in a workload id
        (`WorkloadSubmission.check_new`: a control character, which would forge a log line, or
        too long), and which Serve does not refuse, is carried as a digest."""
        name = f"{self.app}/{self.deployment}"
        if len(name) > MAX_WORKLOAD_ID_CHARS // 2 or not name.isprintable():
            name = "sha256-" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:24]
        return f"{WORKLOAD_PREFIX}{name}/{self.unique_id}"


def is_pool_workload(workload_id: str) -> bool:
    return workload_id.startswith(WORKLOAD_PREFIX)


def replica_from_actor(actor: Any) -> ServeReplica | None:
    """A Serve replica from a row of Ray's actor table (`ray.util.state.list_actors(detail=True)`),
    or None for any other actor, a dead one, or one without a replica name. GPUs are rounded up
    to whole GPUs: the core books whole GPUs, so a fractional-GPU replica is counted as one."""
    if not str(actor.class_name or "").startswith(REPLICA_CLASS_PREFIX):
        return None
    name = str(actor.name or "")
    if not name.startswith(REPLICA_NAME_PREFIX):
        return None
    parts = name[len(REPLICA_NAME_PREFIX) :].split("#")
    if len(parts) != 3:
        return None
    app, deployment, unique_id = parts
    if actor.state == "ALIVE":
        node_id = actor.node_id or None
    elif actor.state in WAITING_STATES:
        node_id = None  # a restarting actor may still name its dead node
    else:
        return None
    required = actor.required_resources or {}
    gpus = math.ceil(float(required.get("GPU", 0.0)))
    return ServeReplica(app, deployment, unique_id, gpus, node_id, int(required.get(SERVE_GPU_RESOURCE, 0)))


# -- the decision, pure ------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Submit:
    """Queue a waiting replica in the core."""

    replica: ServeReplica
    team: str


@dataclass(frozen=True, slots=True)
class Adopt:
    """Record a placed replica as a lease on the node where Ray put it (taking it out of the
    queue if it was still queued)."""

    replica: ServeReplica
    team: str
    node: str


@dataclass(frozen=True, slots=True)
class Release:
    """Give back a lease whose replica went away (or now runs elsewhere: an Adopt follows)."""

    workload_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Cancel:
    """Withdraw a queued workload whose replica went away."""

    workload_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Running:
    """A replica runs on exactly the GPUs the core granted it."""

    replica: ServeReplica
    node: str


@dataclass(frozen=True, slots=True)
class Unowned:
    """A GPU replica whose app names no team with an inference quota: reported, never granted."""

    replica: ServeReplica
    reason: str


Action = Submit | Adopt | Release | Cancel | Running | Unowned


def plan(
    replicas: Iterable[ServeReplica],
    held: Mapping[str, tuple[str, ...] | None],
    teams: Collection[str],
    starting: Collection[str] = (),
) -> list[Action]:
    """Ray's GPU replicas against the core's pool workloads (workload id -> its lease's nodes, or
    None while queued) -> actions, in the order they must be applied: releases and cancels
    first (they free GPUs in the ledger), then adoptions, then submissions. `starting`: waiting
    replicas seen only just now, not queued yet (most are a worker process starting on GPUs Ray
    has already given them, and will show up placed)."""
    frees: list[Action] = []
    adopts: list[Action] = []
    rest: list[Action] = []
    seen: set[str] = set()
    replicas = list(replicas)
    # Replicas of one deployment are interchangeable, and Ray picks which waiting replica takes
    # a freed GPU: when it places another one than the core granted, the grant moves to the
    # placed replica and the granted one waits again (found by the demo: otherwise the placed
    # one ran outside any lease and the scheduler handed its GPU to training as well).
    granted_waiting: dict[tuple[str, str, tuple[str, ...]], list[str]] = {}
    for r in replicas:
        nodes_of_r = held.get(r.workload_id)
        if r.node_id is None and nodes_of_r is not None:
            granted_waiting.setdefault((r.app, r.deployment, nodes_of_r), []).append(r.workload_id)
    for replica in replicas:
        if replica.gpus <= 0:
            continue
        team = app_team(replica.app)
        if team is None or team not in teams:
            why = (
                f"app {replica.app!r} names no team: name it '<team>{TEAM_SEPARATOR}<app>'"
                if team is None
                else f"team {team!r} has no inference quota in scheduler.yaml"
            )
            rest.append(Unowned(replica, why))
            continue
        wid = replica.workload_id
        seen.add(wid)
        nodes = held.get(wid)
        if replica.node_id is None:
            if wid not in held and wid not in starting:
                rest.append(Submit(replica, team))
            continue  # queued, or granted and Ray has not placed it yet
        if nodes is not None and nodes != (replica.node_id,):
            frees.append(Release(wid, f"granted {list(nodes)}, Ray placed it on {replica.node_id}"))
        elif nodes is not None:
            rest.append(Running(replica, replica.node_id))
            continue
        # Unleased, or still queued because Ray placed it before the core granted it.
        if nodes is None:
            swap = granted_waiting.get((replica.app, replica.deployment, (replica.node_id,)))
            if swap:
                frees.append(Release(swap.pop(), f"Ray placed {replica.replica_id} on its GPU first; waits again"))
        adopts.append(Adopt(replica, team, replica.node_id))
    for wid, nodes in held.items():
        if wid not in seen:
            frees.append(Release(wid, "replica gone") if nodes is not None else Cancel(wid, "replica gone"))
    return frees + adopts + rest


def reclaim_chains(events: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cause chain of each reclaim for a Serve replica, from the scheduler's event log:
    pending replica -> reclaim decision (victims) -> notice to each victim -> the victim's
    checkpoint-and-release (`requeued`) or stop -> replica granted (`admitted`, or `adopted` when
    Ray placed it before the core's next tick) -> replica running."""
    ordered = sorted(events, key=lambda e: e["seq"])
    chains = []
    for decision in (e for e in ordered if e["kind"] == "reclaim_decision"):
        wid = decision["workload_id"]
        before = [e for e in ordered if e["seq"] < decision["seq"]]
        after = [e for e in ordered if e["seq"] > decision["seq"]]
        steps = [e for e in before if e["workload_id"] == wid and e["kind"] == "replica_pending"][-1:]
        since = steps[0]["seq"] if steps else decision["seq"]  # notices go out in the same tick
        steps.append(decision)
        victims = [v["workload_id"] for v in decision.get("victims", [])]
        for victim in victims:
            mine = [e for e in ordered if e["seq"] > since and e["workload_id"] == victim]
            notice = next((e for e in mine if e["kind"] == "preemption_notice" and e.get("preemptor") == wid), None)
            if notice is None:
                continue
            steps.append(notice)
            gone = next(
                (e for e in mine if e["seq"] > notice["seq"] and e["kind"] in ("requeued", "released", "stop_order")),
                None,
            )
            if gone is not None:
                steps.append(gone)
        for wanted in (("admitted", "adopted"), ("replica_running",)):  # adopted: Ray placed it first
            found = next((e for e in after if e["workload_id"] == wid and e["kind"] in wanted), None)
            if found is not None:
                steps.append(found)
        kinds = [s["kind"] for s in steps]
        complete = kinds[0] == "replica_pending" and kinds[-1] == "replica_running" and len(steps) >= 5
        chains.append(
            {
                "workload_id": wid,
                "replica": decision.get("replica"),
                "victims": victims,
                "steps": steps,
                "complete": complete,
                "pending_to_running_s": round(steps[-1]["at"] - steps[0]["at"], 3) if complete else None,
            }
        )
    return chains


# -- applying it -------------------------------------------------------------------------------
class ServePool:
    """The scheduler actor's reconciler of Serve's GPU replicas (its lock held while applying)."""

    REFRESH_S = 1.0  # how often the actor reads Serve's replicas (on a thread of its own)
    SETTLE_S = 2.0  # a replica waits this long before it is queued (see `plan`'s `starting`)

    def __init__(self, policy: SchedulerPolicy, journal: SchedulerJournal) -> None:
        self._teams = inference_teams(policy)
        self._journal = journal
        self._unreadable = False  # the state API failed last time (logged once per outage)
        self._running: set[str] = set()  # workloads whose replica was seen on its lease
        self._waiting_since: dict[str, float] = {}  # replica workload -> first seen waiting
        self._outside: dict[str, dict[str, Any]] = {}  # replica id -> why it runs without a lease
        self._unheld: list[str] = []  # GPU replicas that ask for no Serve slots
        # Adoptions the core refused: workload -> (node, why, the driver's generation after)
        self._refused: dict[str, tuple[str | None, str, int]] = {}
        self._replicas = Gauge(
            "switchyard_scheduler_serve_replicas",
            description="Serve GPU replicas by state: running (leased), pending, outside_lease.",
            tag_keys=("state",),
        )

    def read(self) -> list[ServeReplica] | None:
        """Ray's Serve replicas (None when the state API fails). A read through the dashboard:
        seconds when it is busy, its 30 s timeout when it hangs."""
        import ray
        from ray.util.state import list_actors

        try:
            address = ray.get_runtime_context().gcs_address
            actors = list_actors(address=address, filters=[("state", "!=", "DEAD")], detail=True, limit=10_000)
        except Exception as exc:  # noqa: BLE001 - the state API raises several types; retry next refresh
            if not self._unreadable:
                log.warning("serve pool: cannot read Ray's actor table (retrying every %.0fs): %s", self.REFRESH_S, exc)
            self._unreadable = True
            return None
        self._unreadable = False
        return [r for r in (replica_from_actor(a) for a in actors) if r is not None]

    def reconcile(
        self,
        state: LiveState,
        replicas: list[ServeReplica],
        now: float,
        apply: Callable[[list[ReplicaChange]], Mapping[str, str]],
        generation: int = 0,
    ) -> bool:
        """Plan Ray's replicas against the scheduler's state, and hand the changes to `apply`
        (the actor logs them as one driver event, `Driver.serve_replicas`, and returns the
        adoptions the core refused). Caller holds the actor's lock. True when there were changes.

        `generation`: the driver's count of events applied (`Driver.generation`). An adoption
        the core refused is not asked again until another event may have freed GPUs, so a
        replica running outside any lease does not log an event every refresh."""
        held: dict[str, tuple[str, ...] | None] = {}
        for wid in state.submissions:
            if not is_pool_workload(wid):
                continue
            lease = state.core.lease_of(wid)
            if lease is not None:
                held[wid] = lease.placement
            elif state.core.is_queued(wid):
                held[wid] = None
        waiting = {r.workload_id for r in replicas if r.node_id is None}
        self._waiting_since = {w: self._waiting_since.get(w, now) for w in waiting}
        starting = {w for w, since in self._waiting_since.items() if now - since < self.SETTLE_S}
        outside: dict[str, dict[str, Any]] = {}
        changes: list[ReplicaChange] = []
        adopted: list[Adopt] = []
        for action in plan(replicas, held, self._teams, starting):
            if isinstance(action, Running):
                self._mark_running(state, action.replica.workload_id, action.node, now)
            elif isinstance(action, Unowned):
                outside[action.replica.replica_id] = self._outside_row(action.replica, action.reason)
            elif isinstance(action, Adopt):
                wid = action.replica.workload_id
                node, why, at = self._refused.get(wid, (None, "", -1))
                if node == action.node and at == generation:  # refused, and nothing happened since
                    outside[action.replica.replica_id] = self._outside_row(action.replica, why)
                    continue
                adopted.append(action)
                sub = self._submission(action.replica, action.team)
                changes.append(
                    ReplicaChange(ReplicaAction.ADOPT, sub.workload_id, sub, action.node, app=action.replica.app)
                )
            elif isinstance(action, Submit):
                sub = self._submission(action.replica, action.team)
                changes.append(ReplicaChange(ReplicaAction.QUEUE, sub.workload_id, sub, app=action.replica.app))
            else:
                kind = ReplicaAction.RELEASE if isinstance(action, Release) else ReplicaAction.CANCEL
                changes.append(ReplicaChange(kind, action.workload_id, reason=action.reason))
        refused = apply(changes) if changes else {}
        after = generation + 1 if changes else generation
        self._refused = {w: r for w, r in self._refused.items() if w in waiting or w in self._placed(replicas)}
        for action in adopted:
            wid = action.replica.workload_id
            if wid in refused:
                self._refused[wid] = (action.node, refused[wid], after)
                outside[action.replica.replica_id] = self._outside_row(action.replica, refused[wid])
            elif wid in state.grants:
                self._mark_running(state, wid, action.node, now)
        self._running &= {wid for wid in state.grants if is_pool_workload(wid)}
        for replica_id, row in outside.items():
            if replica_id not in self._outside:
                log.warning(
                    "Serve replica %s (node %s) outside the pool: %s", replica_id, row["node_id"], row["reason"]
                )
        self._outside = outside
        unheld = sorted(r.replica_id for r in replicas if r.gpus and r.slots is not None and r.slots < r.gpus)
        for replica_id in set(unheld) - set(self._unheld):
            log.warning(
                "Serve replica %s asks for fewer %s than GPUs: it may take GPUs granted to a starting job",
                replica_id,
                SERVE_GPU_RESOURCE,
            )
        self._unheld = unheld
        self._export(state)
        return bool(changes)

    def record(self, state: LiveState, decisions: Decisions, now: float) -> None:
        """Journal each reclaim the core decided for a pool workload: its victims, one event."""
        victims: dict[str, list[dict[str, Any]]] = {}
        for notice in decisions.notices:
            if is_pool_workload(notice.preemptor):
                victims.setdefault(notice.preemptor, []).append(
                    {
                        "workload_id": notice.workload_id,
                        "lease_id": notice.lease_id,
                        "reason": notice.reason.value,
                        "rank": notice.victim_rank,
                        "stop_deadline": notice.stop_deadline,
                        "lost_gpu_s": round(notice.lost_gpu_seconds, 1),
                    }
                )
        for wid, chosen in victims.items():
            sub = state.submissions.get(wid)
            self._journal.event(
                "reclaim_decision",
                wid,
                sub.team if sub is not None else "",
                now,
                replica=sub.description if sub is not None else None,
                victims=chosen,
                reserved=dict(state.core.reservations().get(wid, {})),
            )

    def report(self, state: LiveState, now: float) -> dict[str, Any]:
        """For `status`: leased replicas, pending ones (and whether their team is at its quota),
        GPU replicas running outside any lease, and GPU replicas that ask for no Serve slots
        (deployed without `grant_holds.serve_gpu_options`)."""
        leased = []
        for wid, grant in state.grants.items():
            if is_pool_workload(wid):
                leased.append(
                    {
                        "workload_id": wid,
                        "team": grant.team,
                        "nodes": [p.node_id for p in grant.placements],
                        "running": wid in self._running,
                    }
                )
        pending = []
        for item in state.core.pending():
            wid = item.request.workload_id
            if is_pool_workload(wid):
                pending.append(
                    {
                        "workload_id": wid,
                        "team": item.request.team,
                        "gpus": item.request.gpus,
                        "waiting_s": round(now - item.queued_at, 1),
                        "reserved": dict(state.core.reservations().get(wid, {})),
                    }
                )
        return {
            "leased": leased,
            "pending": pending,
            "outside_lease": list(self._outside.values()),
            "without_serve_slots": list(self._unheld),
        }

    # -- helpers (lock held) -------------------------------------------------------------------
    def _submission(self, replica: ServeReplica, team: str) -> WorkloadSubmission:
        return WorkloadSubmission(
            workload_id=replica.workload_id,
            team=team,
            workload_class=WorkloadClass.INFERENCE,
            priority_class=INFERENCE_PRIORITY,
            bundles=(replica.gpus,),
            description=replica.replica_id[:MAX_DESCRIPTION_CHARS],
        )

    @staticmethod
    def _placed(replicas: list[ServeReplica]) -> set[str]:
        return {r.workload_id for r in replicas if r.node_id is not None}

    def _mark_running(self, state: LiveState, wid: str, node: str, now: float) -> None:
        if wid in self._running:
            return
        self._running.add(wid)
        # Once per workload, also across a restart of the actor (this set is not persisted).
        if any(e["kind"] == "replica_running" for e in self._journal.events(wid)):
            return
        grant = state.grants.get(wid)
        self._journal.event(
            "replica_running",
            wid,
            grant.team if grant is not None else "",
            now,
            node=node,
            lease_id=grant.lease_id if grant is not None else None,
        )

    def _outside_row(self, replica: ServeReplica, reason: str) -> dict[str, Any]:
        return {
            "replica": replica.replica_id,
            "app": replica.app,
            "gpus": replica.gpus,
            "node_id": replica.node_id,
            "reason": reason,
        }

    def _export(self, state: LiveState) -> None:
        running = sum(1 for wid in state.grants if is_pool_workload(wid))
        pending = sum(1 for p in state.core.pending() if is_pool_workload(p.request.workload_id))
        self._replicas.set(running, tags={"state": "running"})
        self._replicas.set(pending, tags={"state": "pending"})
        self._replicas.set(len(self._outside), tags={"state": "outside_lease"})
