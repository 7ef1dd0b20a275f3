"""Where the platform's singleton actors run.

The publisher, the ledger and the scheduler keep state on the head's local disk (the policy
checkout, SQLite files, the scheduler's journal): each is pinned to the head node, so a
restart never brings it up on another node in front of an empty directory. Ray gives the head
node the `node:__internal_head__` resource; a sliver of it pins without taking a slot.

Each of them also says `num_cpus=0`: Ray gives an actor that names no resources 1 CPU to
schedule and 0 to run, but one that names any (this pin) and no CPUs holds 1 CPU for its
whole life. The head's CPUs are for the Serve replicas pinned there (the console).
"""

from __future__ import annotations

from typing import Any

HEAD_RESOURCE = "node:__internal_head__"


def cluster_hosts() -> int:
    """How many distinct hosts the cluster's live nodes are on (nodes on one machine share
    its disks; Ray names a node's host by its IP)."""
    import ray

    return len({n["NodeManagerAddress"] for n in ray.nodes() if n["Alive"]})


def on_head() -> dict[str, Any]:
    """Actor options that pin an actor to the head node."""
    return {"resources": {HEAD_RESOURCE: 0.001}}
