"""Serve's GPU replicas entering and leaving the core, as driver events.

The Serve pool (`switchyard.cluster.serve_pool`) compares Ray's replicas with the core's pool
workloads and decides what changes (its pure `plan`); each change reaches the core here, as one
logged `serve_replicas` event, so the write-ahead log replays it like any other event and no
snapshot is needed to keep it. A change carries everything it needs (the replica's submission,
the node Ray placed it on), so replay does not depend on the pool's timers or on Ray.

Applying a change that no longer fits the state (the pool planned it, then a tick granted the
queued replica first) does nothing and says why in a diagnostic: the pool plans again from
Ray's next report.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from switchyard.scheduler.api import LeaseGrant, Placement, WorkloadSubmission
from switchyard.scheduler.driver.effects import Diagnostic, Effect, EventKind, JournalEvent
from switchyard.scheduler.driver.state import LiveState


class ReplicaAction(StrEnum):
    QUEUE = "queue"  # a replica waits for GPUs: queue it in the core
    ADOPT = "adopt"  # Ray placed a replica: a lease on that node, out of the queue if queued
    RELEASE = "release"  # its replica went away (or runs elsewhere): give the lease back
    CANCEL = "cancel"  # a queued replica went away: withdraw it


@dataclass(frozen=True, slots=True)
class ReplicaChange:
    action: ReplicaAction
    workload_id: str
    submission: WorkloadSubmission | None = None
    """The replica as a workload (QUEUE and ADOPT)."""
    node: str | None = None
    """Where Ray placed it (ADOPT)."""
    reason: str = ""
    """Why it leaves (RELEASE and CANCEL), for the event log."""
    app: str = ""

    def to_record(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "workload_id": self.workload_id,
            "submission": None if self.submission is None else self.submission.model_dump(mode="json"),
            "node": self.node,
            "reason": self.reason,
            "app": self.app,
        }

    @classmethod
    def from_record(cls, raw: Mapping[str, Any]) -> ReplicaChange:
        sub = raw.get("submission")
        return cls(
            ReplicaAction(raw["action"]),
            raw["workload_id"],
            None if sub is None else WorkloadSubmission.model_validate(sub),
            raw.get("node"),
            raw.get("reason", ""),
            raw.get("app", ""),
        )


def apply_changes(
    state: LiveState, changes: Iterable[ReplicaChange], now: float
) -> tuple[dict[str, str], list[Effect]]:
    """Apply the changes in order (the pool puts the ones that free GPUs first). Returns the
    adoptions the ledger or the quota refused (workload id -> why: the replica runs outside any
    lease) and the effects."""
    refused: dict[str, str] = {}
    effects: list[Effect] = []
    for change in changes:
        if change.action is ReplicaAction.QUEUE:
            _queue(state, change, now, effects)
        elif change.action is ReplicaAction.ADOPT:
            problem = _adopt(state, change, now, effects)
            if problem is not None:
                refused[change.workload_id] = problem
        else:
            _drop(state, change, now, effects)
    return refused, effects


def _queue(state: LiveState, change: ReplicaChange, now: float, effects: list[Effect]) -> None:
    sub = change.submission
    assert sub is not None, "a QUEUE change carries its submission"
    try:
        state.core.submit(sub.gang(), now)
    except ValueError as err:  # queued or granted since the pool planned
        effects.append(Diagnostic(f"serve pool: replica {sub.workload_id} not queued: {err}", warning=False))
        return
    state.submissions[sub.workload_id] = sub
    state.queued_since[sub.workload_id] = now
    details = {"replica": sub.description, "app": change.app, "gpus": sum(sub.bundles)}
    effects.append(JournalEvent(EventKind.REPLICA_PENDING, sub.workload_id, sub.team, now, details))


def _adopt(state: LiveState, change: ReplicaChange, now: float, effects: list[Effect]) -> str | None:
    """Lease the GPUs a placed replica runs on; returns why not when the ledger or the quota
    refuses (a queued replica is then withdrawn: it runs already, and a grant now would book
    GPUs nobody uses)."""
    sub, node = change.submission, change.node
    assert sub is not None and node is not None, "an ADOPT change carries its submission and node"
    wid = sub.workload_id
    was_queued = state.core.is_queued(wid)
    try:
        start = state.core.adopt(sub.gang(), (node,), now)
    except ValueError as err:
        if was_queued:
            state.core.cancel(wid, now)
            why = {"reason": f"placed outside a lease: {err}"}
            effects.append(JournalEvent(EventKind.CANCELLED, wid, sub.team, now, why))
            forget(state, wid)
        return str(err)
    state.submissions[wid] = sub
    state.queued_since.pop(wid, None)
    state.grants[wid] = LeaseGrant(
        lease_id=start.lease_id,
        workload_id=wid,
        team=sub.team,
        granted_at=now,
        borrowing=start.borrowing,
        placements=(Placement(node_id=node, node_group=state.nodes[node].node_group, gpus=sum(sub.bundles)),),
    )
    # The GPUs too: an adopted replica may have no `replica_pending` before it (it started
    # outside a lease), and the log is what the console rebuilds the GPU split from.
    details = {"lease_id": start.lease_id, "node": node, "was_queued": was_queued, "gpus": sum(sub.bundles)}
    effects.append(JournalEvent(EventKind.ADOPTED, wid, sub.team, now, details))
    return None


def _drop(state: LiveState, change: ReplicaChange, now: float, effects: list[Effect]) -> None:
    wid = change.workload_id
    team = state.team_of(wid)
    if change.action is ReplicaAction.RELEASE:
        lease = state.core.lease_of(wid)
        if lease is not None:
            state.core.release(lease.lease_id, now, finished=True)
        kind = EventKind.RELEASED
    else:
        if not state.core.is_queued(wid):  # granted or gone since the pool planned
            effects.append(Diagnostic(f"serve pool: replica {wid} not cancelled: not queued", warning=False))
            return
        state.core.cancel(wid, now)
        kind = EventKind.CANCELLED
    effects.append(JournalEvent(kind, wid, team, now, {"reason": change.reason}))
    forget(state, wid)


def forget(state: LiveState, workload_id: str) -> None:
    """A replica's workload is gone at once: replicas are not listed after they end."""
    for table in (state.submissions, state.grants, state.notices, state.claims, state.queued_since):
        table.pop(workload_id, None)
