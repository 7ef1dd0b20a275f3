"""What a gateway replica opens at start on whatever node it lands: its policy set from the
head's publisher, and a check that its shared state is the head's.

Host-local things (the audit spool, charge journals, audit anchors, copies of published policy
sets) go under this node's state directory: `$SWITCHYARD_STATE_DIR` in the node's environment
when it is set (each node of a real cluster has its own disk; a test gives each fake node its
own), else the directory the app was deployed with.
"""

from __future__ import annotations

import os
from pathlib import Path

import ray

from switchyard.cluster.policy_publisher import PublisherClient, policy_publisher
from switchyard.db.location import check_layout, require_same_state
from switchyard.policy.published import PublishedPolicyStore, save_dir_for
from switchyard.state import STATE_DIR_ENV


def node_state_dir(app_state_dir: str | Path) -> Path:
    path = Path(os.environ.get(STATE_DIR_ENV) or app_state_dir)
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path.resolve()


def published_policies(policies_dir: str, head_state_dir: str, node_state: Path, replica: str) -> PublishedPolicyStore:
    """The replica's policy store over the head's publisher, after the layout checks (a replica
    that fails them, or gets no set, raises: Serve retries it and it takes no traffic)."""
    client = PublisherClient(policy_publisher(policies_dir, head_state_dir))
    check_layout(node_state, hosts=1)  # SQLite on a network filesystem, even on one host
    require_same_state(client.state_identity(), node_state)
    node = ray.get_runtime_context().get_node_id()
    return PublishedPolicyStore(client, save_dir_for(node_state), replica, node)


def replica_state(policies_dir: str, head_state_dir: str, replica: str) -> tuple[Path, PublishedPolicyStore]:
    """What a gateway replica opens first: this node's state directory and its policy store."""
    state = node_state_dir(head_state_dir)
    return state, published_policies(policies_dir, head_state_dir, state, replica)
