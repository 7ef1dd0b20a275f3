"""A driver on a small cluster, and ways to read its effects, for the driver tests."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, TypeVar

from sched_support import nodes, policy

from switchyard.scheduler.api import LeaseGrant, WorkloadSubmission
from switchyard.scheduler.claims import ClaimPolicy
from switchyard.scheduler.core import PolicyKnobs, WorkloadClass
from switchyard.scheduler.driver import Driver
from switchyard.scheduler.driver.effects import Effect, JournalEvent

T = TypeVar("T")
GRACE_S = PolicyKnobs().preemption_grace_s
CLASSES = {
    "production-inference": WorkloadClass.INFERENCE,
    "training": WorkloadClass.TRAINING,
    "exploratory": WorkloadClass.EXPLORATORY,
}


def driver(guarantees: dict[str, int], node_count: int = 1, claim_timeout_s: float = 1e9) -> Driver:
    """A driver whose nodes n0.. (8 GPUs each, groups g0.., two nodes a group) Ray has reported."""
    d = Driver.empty(policy(guarantees), 0.0, ClaimPolicy(timeout_s=claim_timeout_s))
    d.nodes_seen(nodes(node_count), 0.0)
    return d


def submission(
    wid: str, team: str, gpus: int = 8, priority: str = "training", entrypoint: str | None = None
) -> WorkloadSubmission:
    return WorkloadSubmission(
        workload_id=wid,
        team=team,
        workload_class=CLASSES[priority],
        priority_class=priority,
        bundles=(gpus,),
        entrypoint=entrypoint,
    )


def admit(d: Driver, sub: WorkloadSubmission, now: float) -> LeaseGrant:
    d.submit(sub, now)
    d.tick(now)
    grant = d.lease(sub.workload_id)
    assert grant is not None, f"{sub.workload_id} was not admitted"
    return grant


def of(effects: Iterable[Effect], kind: type[T]) -> list[T]:
    return [e for e in effects if isinstance(e, kind)]


def journal(effects: Iterable[Effect], workload_id: str | None = None) -> list[str]:
    """The kinds of event journaled, in order (of one workload, if given)."""
    return [e.kind.value for e in of(effects, JournalEvent) if workload_id in (None, e.workload_id)]


def details(effects: Iterable[Effect], kind: str, workload_id: str) -> dict[str, Any]:
    [event] = [e for e in of(effects, JournalEvent) if e.kind == kind and e.workload_id == workload_id]
    return dict(event.details)


_HOLD_FIELDS = {  # version 4's field of the core's Holds -> version 3's field of the core
    "_amounts": "_reserved",
    "_value": "_reserved_value",
    "_kind": "_hold_kind",
    "_team": "_hold_team",
    "counts": "_hold_counts",
    "_waived_cache": "_waived_cache",
    "per_node": "_held",
    "_held_free": "_held_free",
}


def _without(node: Any, cls: str, field: str) -> Any:
    """An encoded state with field `field` of every `cls` object left out."""
    if isinstance(node, list):
        return [_without(v, cls, field) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("c") == cls:
        return {**node, "v": {k: _without(v, cls, field) for k, v in node["v"].items() if k != field}}
    return {k: _without(v, cls, field) for k, v in node.items()}


def as_version_5(node: Any) -> Any:
    """An encoded state as schema version 5 wrote it: the core did not count the GPUs of
    non-preemptible leases per node (`_unpreemptible`)."""
    return _without(node, "switchyard.scheduler.core.scheduler:Scheduler", "_unpreemptible")


def as_version_4(node: Any) -> Any:
    """An encoded state as schema version 4 wrote it: as version 5, and the node pool did not
    know its cordoned nodes (`_cordoned`)."""
    return _without(as_version_5(node), "switchyard.scheduler.core.placement:NodePool", "_cordoned")


def as_version_3(node: Any) -> Any:
    """An encoded state as schema version 3 wrote it: as version 4, and the core's holds were
    eight fields of the core, where its `_holds` object is."""
    return _holds_as_version_3(as_version_4(node))


def _holds_as_version_3(node: Any) -> Any:
    if isinstance(node, list):
        return [_holds_as_version_3(v) for v in node]
    if not isinstance(node, dict):
        return node
    if node.get("c") == "switchyard.scheduler.core.scheduler:Scheduler":
        fields: dict[str, Any] = {}
        for name, value in node["v"].items():
            if name == "_holds":
                holds = value["v"]
                assert set(holds) == {"_pool", *_HOLD_FIELDS}, sorted(holds)
                fields.update({old: _holds_as_version_3(holds[new]) for new, old in _HOLD_FIELDS.items()})
            else:
                fields[name] = _holds_as_version_3(value)
        return {**node, "v": fields}
    return {k: _holds_as_version_3(v) for k, v in node.items()}
