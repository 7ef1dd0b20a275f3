"""Who really holds the cluster's GPUs, and which holders have no lease.

Ray cannot stop a workload from asking for GPUs: any driver can create a placement group or a
GPU actor. So the scheduler audits instead. It reads Ray's state API (placement groups,
actors and tasks holding GPUs), groups holdings by Ray job, and compares them with its
leases (a leased job claims its lease with its Ray job id at start) and with Serve's
replicas (the inference pool). What is left is use outside any lease: reported in `status`
and metrics and, when the policy says so, stopped. A leased job holding more GPUs than its
leases grant is reported too (`over_lease`, and the `switchyard_scheduler_over_lease_gpus`
gauge): it is not stopped, since which of its placement groups is the extra one is not known.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from ray.util.state import list_actors, list_placement_groups, list_tasks

log = logging.getLogger(__name__)

SERVE_PREFIXES = ("ServeReplica", "SERVE_REPLICA")  # Serve's replica actor classes and PG names


@dataclass
class JobHoldings:
    job_id: str
    gpus: float = 0.0
    placement_groups: list[str] = field(default_factory=list)
    actors: list[str] = field(default_factory=list)  # "ClassName(actor_id)" outside placement groups
    tasks: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class OverLease:
    """A leased job holding more GPUs than its leases grant it."""

    holding: JobHoldings
    leased_gpus: int

    @property
    def excess_gpus(self) -> float:
        return self.holding.gpus - self.leased_gpus


@dataclass(frozen=True)
class GpuAccounting:
    serve_gpus: float
    by_job: dict[str, JobHoldings]  # non-Serve holders, by Ray job id
    unleased: tuple[JobHoldings, ...]
    over_lease: tuple[OverLease, ...] = ()

    @property
    def unleased_gpus(self) -> float:
        return sum(h.gpus for h in self.unleased)

    @property
    def over_lease_gpus(self) -> float:
        return sum(o.excess_gpus for o in self.over_lease)


def compare_with_leases(
    by_job: dict[str, JobHoldings], leased: dict[str, int]
) -> tuple[tuple[JobHoldings, ...], tuple[OverLease, ...]]:
    """Jobs holding GPUs with no lease, and leased jobs holding more than their leases' GPUs
    (`leased`: Ray job id -> GPUs of the leases it claimed; a sweep's trials share one job)."""
    unleased = tuple(h for job, h in sorted(by_job.items()) if job not in leased and h.gpus > 0)
    over = tuple(
        OverLease(h, leased[job]) for job, h in sorted(by_job.items()) if job in leased and h.gpus > leased[job]
    )
    return unleased, over


def _gpus(resources: dict[str, Any] | None) -> float:
    return float((resources or {}).get("GPU", 0.0))


def _is_serve(name: str | None) -> bool:
    return bool(name) and str(name).startswith(SERVE_PREFIXES)


def account(address: str, leased: dict[str, int], limit: int = 10_000) -> GpuAccounting:
    """Group every GPU holding on the cluster by Ray job; flag jobs that hold GPUs without a
    lease, and leased jobs that hold more than their leases (`leased`: job id -> GPUs)."""
    by_job: dict[str, JobHoldings] = {}
    serve_gpus = 0.0

    def holder(job_id: str) -> JobHoldings:
        return by_job.setdefault(job_id, JobHoldings(job_id))

    serve_pgs: set[str] = set()
    for pg in list_placement_groups(address=address, filters=[("state", "=", "CREATED")], detail=True, limit=limit):
        gpus = sum(_gpus(b.get("unit_resources")) for b in pg.bundles or [])
        if not gpus:
            continue
        if _is_serve(pg.name):
            serve_pgs.add(pg.placement_group_id)
            serve_gpus += gpus
            continue
        h = holder(pg.creator_job_id)
        h.gpus += gpus
        h.placement_groups.append(pg.placement_group_id)
    for actor in list_actors(address=address, filters=[("state", "=", "ALIVE")], detail=True, limit=limit):
        gpus = _gpus(actor.required_resources)
        if not gpus or actor.placement_group_id:
            continue  # inside a placement group: already counted with the group
        if _is_serve(actor.class_name):
            serve_gpus += gpus
            continue
        h = holder(actor.job_id)
        h.gpus += gpus
        h.actors.append(f"{actor.class_name}({actor.actor_id})")
    for task in list_tasks(address=address, filters=[("state", "=", "RUNNING")], detail=True, limit=limit):
        gpus = _gpus(getattr(task, "required_resources", None))
        if not gpus or getattr(task, "placement_group_id", None) or task.actor_id:
            continue
        h = holder(task.job_id)
        h.gpus += gpus
        h.tasks.append(f"{task.func_or_class_name}({task.task_id})")
    unleased, over = compare_with_leases(by_job, leased)
    return GpuAccounting(serve_gpus, by_job, unleased, over)


def stop_unleased(holding: JobHoldings) -> list[str]:
    """Stop what a job holds without a lease: its placement groups (which ends the actors in them).
    Returns what was done; GPU actors outside placement groups are reported, not killed, since
    Ray offers no public way to kill an actor one does not hold a handle to."""
    import ray
    from ray.util.placement_group import PlacementGroup, remove_placement_group

    done = []
    for pg_id in holding.placement_groups:
        remove_placement_group(PlacementGroup(ray.PlacementGroupID.from_hex(pg_id)))
        done.append(f"removed placement group {pg_id}")
    if holding.actors or holding.tasks:
        log.warning(
            "job %s also holds GPUs outside placement groups (%s); stop its driver to free them",
            holding.job_id,
            holding.actors + holding.tasks,
        )
    return done


def summarize(accounting: GpuAccounting) -> dict[str, Any]:
    return {
        "serve_gpus": accounting.serve_gpus,
        "unleased_gpus": accounting.unleased_gpus,
        "unleased": [
            {
                "job_id": h.job_id,
                "gpus": h.gpus,
                "placement_groups": h.placement_groups,
                "actors": h.actors,
                "tasks": h.tasks,
            }
            for h in accounting.unleased
        ],
        "over_lease_gpus": accounting.over_lease_gpus,
        "over_lease": [
            {"job_id": o.holding.job_id, "gpus": o.holding.gpus, "leased_gpus": o.leased_gpus, "excess": o.excess_gpus}
            for o in accounting.over_lease
        ],
    }
