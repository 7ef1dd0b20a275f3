"""Operators' node commands, as rules on the live state: cordon, uncordon, drain (kubectl's model).

- *cordon*: the scheduler places no new lease on the node; the leases there run on. The cordon
  is the operator's, kept in `LiveState.cordons` (so in the write-ahead log and snapshots): Ray's
  node refreshes do not undo it, and a node that leaves and comes back is still cordoned.
- *uncordon*: placements may land there again (a drain's notices already sent stand).
- *drain*: cordon, then every lease on the node that may be moved gets a preemption notice
  through the same path as a preemption's victim (checkpoint, release by the grace deadline, or
  be stopped then; the workload is requeued either way, and a requeue is no failure). What may
  not be moved is reported as *blocking* the drain, as `kubectl drain` reports pods it cannot
  evict: a non-preemptible lease (its priority class promises it is never preempted; `force`
  notices it too), and a Serve replica (Serve, not the scheduler, places and replaces replicas:
  scale the deployment down, or Serve replaces the replica when it is stopped; `force` does not
  change that). The node stays cordoned; it is *drained* once nothing runs there.

A node is named by its id or by a prefix of it (`status` shows 12 characters); an unknown or
ambiguous name is a `NodeLookupError` with one line for the operator.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from switchyard.scheduler.api import StopReason
from switchyard.scheduler.core import Lease, LeaseState, PreemptionDecision, StopOrder, WorkloadClass
from switchyard.scheduler.core.cordon import drain_notice, hold_node, is_preemptible, leases_on, release_node
from switchyard.scheduler.driver.state import LiveState, NodeCordon


class NodeLookupError(ValueError):
    """A node name that matches no node id, or more than one."""


class NodeState(StrEnum):
    READY = "ready"  # placements may land there
    CORDONED = "cordoned"
    DRAINING = "draining"  # cordoned by a drain, and leases still run there
    DRAINED = "drained"  # cordoned by a drain, and nothing runs there any more


@dataclass(frozen=True, slots=True)
class DrainBlocker:
    workload_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class DrainReport:
    """What a drain did: leases noticed now, leases already leaving, leases it cannot move."""

    node: str
    noticed: tuple[str, ...]
    leaving: tuple[str, ...]
    blocking: tuple[DrainBlocker, ...]


def resolve(state: LiveState, name: str) -> str:
    """The node id `name` is, or starts (nodes Ray reports and cordoned nodes away from it)."""
    known = sorted(set(state.nodes) | set(state.cordons))
    if name in known:
        return name
    matches = [n for n in known if name and n.startswith(name)]
    if not matches:
        raise NodeLookupError(f"unknown node {name!r}: no node id starts with it (see `switchyard nodes list`)")
    if len(matches) > 1:
        shown = ", ".join(m[:16] for m in matches[:3]) + (", ..." if len(matches) > 3 else "")
        raise NodeLookupError(f"node {name!r} is ambiguous: {len(matches)} node ids start with it ({shown})")
    return matches[0]


def cordon(state: LiveState, node: str, now: float) -> bool:
    """Returns False when the node was cordoned already."""
    if node in state.cordons:
        return False
    state.cordons[node] = NodeCordon(node, now)
    if node in state.nodes:
        hold_node(state.core, node)
    return True


def uncordon(state: LiveState, node: str) -> bool:
    """Returns False when the node was not cordoned."""
    if state.cordons.pop(node, None) is None:
        return False
    if node in state.nodes:
        release_node(state.core, node)
    return True


def drain(state: LiveState, node: str, force: bool, now: float) -> tuple[DrainReport, list[PreemptionDecision]]:
    """Cordon `node` and put what may move under notice (see the module doc): the core's
    decisions, for the driver to send the notices of."""
    cordon(state, node, now)
    state.cordons[node] = NodeCordon(node, state.cordons[node].since, now)
    report, movable = survey(state, node, force, leases_on(state.core, node))
    decisions = [drain_notice(state.core, lease, node, now) for lease in movable]
    noticed = tuple(d.workload_id for d in decisions)
    return DrainReport(node, noticed, report.leaving, report.blocking), decisions


def survey(state: LiveState, node: str, force: bool, leases: list[Lease]) -> tuple[DrainReport, list[Lease]]:
    """What a drain of `node` (whose leases are `leases`) would do now, without doing it; and
    the leases it would notice."""
    leaving: list[str] = []
    blocking: list[DrainBlocker] = []
    movable: list[Lease] = []
    for lease in leases:
        workload = lease.request.workload_id
        if lease.state is LeaseState.PREEMPTING:
            leaving.append(workload)
        elif lease.request.workload_class is WorkloadClass.INFERENCE:
            blocking.append(DrainBlocker(workload, "a Serve replica: Serve places it (scale its deployment down)"))
        elif not force and not is_preemptible(state.core, lease):
            why = f"priority class {lease.request.priority_class!r} is not preemptible (--force notices it too)"
            blocking.append(DrainBlocker(workload, why))
        else:
            movable.append(lease)
    return DrainReport(node, (), tuple(leaving), tuple(blocking)), movable


def stop_reason(state: LiveState, stop: StopOrder) -> StopReason:
    """The reason a core stop order is carried out for: a grace period that ran out on a drained
    node's lease is the drain's (its workload is requeued, as any noticed lease's)."""
    reason = StopReason(stop.reason)
    lease = state.core.lease_of(stop.workload_id)
    drained = lease is not None and any(_drained(state, n) for n in lease.placement)
    if reason is StopReason.GRACE_PERIOD_OVER and drained:
        return StopReason.DRAIN
    return reason


def _drained(state: LiveState, node: str) -> bool:
    found = state.cordons.get(node)
    return found is not None and found.drain_requested_at is not None


def node_state(state: LiveState, node: str, leases: list[Lease]) -> NodeState:
    """`leases`: those on the node now."""
    found = state.cordons.get(node)
    if found is None:
        return NodeState.READY
    if found.drain_requested_at is None:
        return NodeState.CORDONED
    return NodeState.DRAINING if leases else NodeState.DRAINED
