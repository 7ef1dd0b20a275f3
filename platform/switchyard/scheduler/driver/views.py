"""Read-only views of the live scheduler's state: what `train list`, `status`, the gauges and the
GPU audit are computed from. Pure; the adapter calls them with its lock held."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.scheduler.core.cordon import leases_by_node
from switchyard.scheduler.core.explain import CapacityNeed
from switchyard.scheduler.driver import node_cordons
from switchyard.scheduler.driver.state import LiveState
from switchyard.scheduler.driver.tally import LiveTally, TeamGpus
from switchyard.scheduler.queue_view import queue_rows


def workload_rows(state: LiveState, now: float) -> list[dict[str, Any]]:
    """One row per workload ever submitted (`SchedulerActor.list_workloads`)."""
    core = state.core
    queue = queue_rows(core.pending(), core.explainer(now), now)
    out = []
    for wid, sub in state.submissions.items():
        lease = core.lease_of(wid)
        waiting = queue.get(wid)
        status = "queued" if waiting is not None else (lease.state.value if lease else "done")
        job = state.launched.get(wid)
        out.append(
            {
                "workload_id": wid,
                "team": sub.team,
                "priority_class": sub.priority_class,
                "gpus": sum(sub.bundles),
                "state": status,
                "description": sub.description,
                "ray_job": job.submission_id if job is not None else None,
                "attempt": waiting.attempt if waiting else state.attempts.get(wid, 0),
                "waited_s": round(waiting.waited_s, 1) if waiting else None,
                "queue_position": waiting.position if waiting else None,
                "waiting_for": f"{waiting.reason}: {waiting.detail}" if waiting else None,
            }
        )
    return out


def node_rows(state: LiveState, cordoned_only: bool = False) -> list[dict[str, Any]]:
    """One row per node Ray reports, and per cordoned node away from the cluster: its cordon
    state and what still runs there (`switchyard nodes list`; `status`: the cordoned only)."""
    names = set(state.cordons) if cordoned_only else set(state.nodes) | set(state.cordons)
    if not names:
        return []  # `status` on a cluster with nothing cordoned: no pass over the leases
    core = state.core
    by_node = leases_by_node(core)
    rows = []
    for name in sorted(names):
        node, cordon, alive = state.nodes.get(name), state.cordons.get(name), name in state.nodes
        leases = by_node.get(name, []) if alive else []
        blocking = {b.workload_id: b.reason for b in node_cordons.survey(state, name, False, leases)[0].blocking}
        rows.append(
            {
                "node_id": name,
                "alive": alive,
                "node_group": node.node_group if node else None,
                "gpu_type": node.gpu_type if node else None,
                "gpus": node.gpus if node else 0,
                "free_gpus": core.pool.free(name) if alive else 0,
                "state": node_cordons.node_state(state, name, leases).value,
                "cordoned_at": cordon.since if cordon else None,
                "drain_requested_at": cordon.drain_requested_at if cordon else None,
                "leases": [
                    {
                        "workload_id": lease.request.workload_id,
                        "team": lease.request.team,
                        "priority_class": lease.request.priority_class,
                        "gpus": lease.gpus_by_node()[name],
                        "state": lease.state.value,
                        "blocks_drain": blocking.get(lease.request.workload_id),
                    }
                    for lease in leases
                ],
            }
        )
    return rows


def cluster_view(state: LiveState, now: float) -> dict[str, Any]:
    """GPUs, teams, pools, leases and what is pending, for `status`."""
    snap = state.core.snapshot(now)
    return {
        "total_gpus": snap.total_gpus,
        "free_gpus": snap.free_gpus,
        "teams": [asdict(t) for t in snap.teams],
        "pools": [asdict(p) for p in snap.pools],
        "leases": [asdict(lease) for lease in snap.leases],
        "pending": [p.request.workload_id for p in state.core.pending()],
    }


def wait_summary(state: LiveState, now: float) -> dict[str, Any]:
    """Per team, waits of admitted workloads and of those still queued (so a queue that admits
    nothing never looks like no wait)."""
    queued = state.core.pending()
    return state.waits.summary(now, [(p.request.team, now - p.queued_at) for p in queued])


def launched_jobs_on_claimed_leases(state: LiveState) -> dict[str, str]:
    """Submission id -> workload of each job the scheduler launched that holds a claimed lease:
    the jobs whose end the adapter watches for (`Driver.job_exited`)."""
    return {
        job.submission_id: workload
        for workload, job in state.launched.items()
        if workload in state.grants and workload in state.claims
    }


def leased_gpus_by_job(state: LiveState) -> dict[str, int]:
    """Ray job id -> GPUs its claimed leases grant (a Tune sweep's driver job claims one lease per
    trial): what the audit compares each job's GPU holdings with."""
    leased: dict[str, int] = {}
    for workload, job in state.claims.items():
        grant = state.grants.get(workload)
        gpus = sum(p.gpus for p in grant.placements) if grant is not None else 0
        leased[job] = leased.get(job, 0) + gpus
    return leased


def held_grants(state: LiveState, is_replica: Callable[[str], bool]) -> dict[str, tuple[tuple[str, int], ...]]:
    """Lease id -> (node, GPUs) of every grant whose GPUs Serve must not take: all but those of
    Serve's own replicas (`is_replica(workload id)`), whose lease is where Ray already put the
    replica, on slots it holds itself. The adapter holds these nodes' Serve slots for as long
    as the grant lasts (`cluster.grant_holds`)."""
    return {
        grant.lease_id: tuple((p.node_id, p.gpus) for p in grant.placements)
        for workload, grant in state.grants.items()
        if not is_replica(workload)
    }


def leased_bundles(state: LiveState) -> Iterable[tuple[tuple[int, ...], str]]:
    """Every leased gang's bundles and GPU type; with `waiting_for_capacity`, the autoscaler
    request's input."""
    return [(lease.request.bundles, lease.gpu_type) for lease in state.core.leases().values()]


def waiting_for_capacity(state: LiveState) -> list[CapacityNeed]:
    return state.core.waiting_for_capacity()


@dataclass(frozen=True, slots=True)
class GaugeReadings:
    free_gpus: int
    leased_gpus: int
    leases: dict[str, int]  # lease state -> count, every state present
    queued: dict[str, int]  # team -> workloads waiting
    team_gpus: dict[str, TeamGpus]  # team -> GPUs guaranteed, used, borrowed
    share_ratio: dict[str, float]
    """Team -> GPU-seconds received / fair in the last full hour; 1.0 for a team that asked
    for none (it got all it asked for), as Jain's index of no values is 1."""
    jain: float  # Jain's index over the teams' share ratios in the last full hour
    inversion_gpu_s: dict[str, float]  # team -> priority-inversion GPU-seconds since the tally began
    quota_wait_gpu_s: dict[str, float]  # team -> quota-wait GPU-seconds since the tally began


def gauge_readings(state: LiveState, tally: LiveTally, now: float) -> GaugeReadings:
    """Every tick: counts the tally keeps as events happen, no pass over leases or the queue."""
    pool = state.core.pool
    fairness = tally.fairness(now)
    teams = fairness["teams"]
    return GaugeReadings(
        free_gpus=pool.free_gpus,
        leased_gpus=pool.total_gpus - pool.free_gpus,
        leases=tally.leases(),
        queued=tally.queued(),
        team_gpus=tally.team_gpus(),
        share_ratio={t: 1.0 if row["share_ratio_1h"] is None else row["share_ratio_1h"] for t, row in teams.items()},
        jain=1.0 if fairness["jain_1h"] is None else fairness["jain_1h"],
        inversion_gpu_s={t: row["inversion_gpu_s"] for t, row in teams.items()},
        quota_wait_gpu_s={t: row["quota_wait_gpu_s"] for t, row in teams.items()},
    )
