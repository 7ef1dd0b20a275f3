"""Read-only views of the live scheduler's state: what `train list`, `status`, the gauges and the
GPU audit are computed from. Pure; the adapter calls them with its lock held."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from switchyard.scheduler.core import GangRequest, LeaseState
from switchyard.scheduler.driver.state import LiveState
from switchyard.scheduler.queue_view import queue_rows


def workload_rows(state: LiveState, now: float) -> list[dict[str, Any]]:
    """One row per workload ever submitted (`SchedulerActor.list_workloads`)."""
    core = state.core
    queue = queue_rows(core.pending(), core.explain_pending, now)
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


def leased_gpus_by_job(state: LiveState) -> dict[str, int]:
    """Ray job id -> GPUs its claimed leases grant (a Tune sweep's driver job claims one lease per
    trial): what the audit compares each job's GPU holdings with."""
    leased: dict[str, int] = {}
    for workload, job in state.claims.items():
        grant = state.grants.get(workload)
        gpus = sum(p.gpus for p in grant.placements) if grant is not None else 0
        leased[job] = leased.get(job, 0) + gpus
    return leased


def leased_bundles(state: LiveState) -> Iterable[tuple[int, ...]]:
    """Every leased gang's bundles; with `waiting_for_capacity`, the autoscaler request's input."""
    return [lease.request.bundles for lease in state.core.leases().values()]


def waiting_for_capacity(state: LiveState) -> list[GangRequest]:
    return state.core.waiting_for_capacity()


@dataclass(frozen=True, slots=True)
class GaugeReadings:
    free_gpus: int
    leased_gpus: int
    leases: dict[str, int]  # lease state -> count, every state present
    queued: dict[str, int]  # team -> workloads waiting


def gauge_readings(state: LiveState, now: float) -> GaugeReadings:
    snap = state.core.snapshot(now, explain_pending=False)  # every tick: counts only
    leases = {s.value: 0 for s in LeaseState}
    for lease in snap.leases:
        leases[lease.state] = leases.get(lease.state, 0) + 1
    return GaugeReadings(
        free_gpus=snap.free_gpus,
        leased_gpus=snap.total_gpus - snap.free_gpus,
        leases=leases,
        queued={team.team: team.queued for team in snap.teams},
    )
