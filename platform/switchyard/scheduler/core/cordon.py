"""Cordoned nodes and drain notices in the policy core (`switchyard nodes cordon | drain`).

A cordoned node takes no new lease: the core holds all of its GPUs, as a reservation holds
GPUs, but for no workload. Every search (placement, backfill, victim searches, reservations)
already sets held GPUs aside, so none of them lands there, and since victim GPUs on the node
count against the hold too, no preemption is planned for room there. Its leases run on; their
GPUs return to the node as they end, and stay held. The hold is the node's size, not its free
GPUs, so it needs no update as leases end. The pool also marks the node cordoned, so that a
same-node-group search counts it as adding no room to its group, rather than counting its
still-leased GPUs against the group's other nodes (as a reservation's are).

A drain notice is a preemption notice without a preemptor: the lease is put under notice (its
job checkpoints and releases by the grace deadline, and is stopped then if it has not), its
workload requeued when it releases unfinished, exactly as a victim's. It is not counted as a
preemption of the workload (the core's backoff counts those): the workload did nothing.

These reach into `Scheduler`'s private state, kept in this one module (as `state_codec` does
for pruning) so that the scheduler module does not grow; mypy checks every name used.
"""

from __future__ import annotations

from switchyard.scheduler.core.model import Lease, LeaseState, PreemptionDecision, PreemptionReason
from switchyard.scheduler.core.scheduler import Scheduler


def hold_node(core: Scheduler, name: str) -> None:
    """Cordon: hold every GPU of node `name` (it must be in the pool) for no workload."""
    core._holds.node_change(name, gpus_held=core.pool.node(name).gpus)
    core.pool.cordon(name)
    core._retarget_reservations()  # reservations on it must choose other nodes


def release_node(core: Scheduler, name: str) -> None:
    """Uncordon, or the node is about to leave the pool: the hold `hold_node` took is given back."""
    core._holds.node_change(name, gpus_held=-core.pool.node(name).gpus)
    core.pool.uncordon(name)
    core._retarget_reservations()  # blocked gangs may reserve it again


def leases_on(core: Scheduler, name: str) -> list[Lease]:
    """The leases with a bundle on node `name`, oldest first."""
    return leases_by_node(core).get(name, [])


def leases_by_node(core: Scheduler) -> dict[str, list[Lease]]:
    """Node -> the leases with a bundle there, oldest first (one pass over the leases)."""
    found: dict[str, list[Lease]] = {}
    for lease in sorted(core.leases().values(), key=lambda x: (x.started_at, x.lease_id)):
        for node in dict.fromkeys(lease.placement):
            found.setdefault(node, []).append(lease)
    return found


def is_preemptible(core: Scheduler, lease: Lease) -> bool:
    return core.policy.priority(lease.request.priority_class).preemptible


def drain_notice(core: Scheduler, lease: Lease, node: str, now: float) -> PreemptionDecision:
    """Put a running lease under notice because its node is drained (see the module doc)."""
    if lease.state is not LeaseState.RUNNING:
        raise AssertionError(f"lease {lease.lease_id} is {lease.state.value}, not running")
    deadline = now + core._knobs.preemption_grace_s
    lease.state = LeaseState.PREEMPTING
    core._preempting[lease.lease_id] = lease
    lease.notice_at = now
    lease.stop_deadline = deadline
    core._count_preemptible(lease, -1)
    if core._knobs.enforce_quota:
        core._book.mark_leaving(core._lease_key(lease), lease.gpus)  # as a victim's: undone on release
    return PreemptionDecision(
        lease.lease_id,
        lease.request.workload_id,
        PreemptionReason.DRAIN,
        preemptor=f"node {node}",
        victim_rank=0,
        stop_deadline=deadline,
        lost_gpu_seconds=lease.lost_gpu_seconds(now),
    )
