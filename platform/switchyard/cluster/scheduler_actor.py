"""The live scheduler: the policy core as a named, detached Ray actor, the one authority over GPUs.

It keeps the core's view of the cluster in step with Ray's (GPU nodes and their
`switchyard/node-group` labels), feeds it events from jobs and the CLI, and ticks it: each
tick's decisions become lease grants that waiting jobs pick up, and preemption notices that
running jobs poll. The core never reads a clock; this adapter passes `time.time()`.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import ray

from switchyard.scheduler.api import LeaseGrant, Notice, Placement, WorkloadSubmission
from switchyard.scheduler.core import Node, Scheduler
from switchyard.scheduler.core.config import load_policy_file

log = logging.getLogger(__name__)

NODE_GROUP_LABEL = "switchyard/node-group"
RACK_LABEL = "switchyard/rack"


def cluster_gpu_nodes() -> list[Node]:
    """Alive Ray nodes with GPUs, as the core's `Node`s (named by Ray node id)."""
    nodes = []
    for n in ray.nodes():
        gpus = int(n.get("Resources", {}).get("GPU", 0))
        if not n.get("Alive") or gpus <= 0:
            continue
        labels = n.get("Labels") or {}
        nodes.append(
            Node(n["NodeID"], gpus, labels.get(NODE_GROUP_LABEL, "default"), labels.get(RACK_LABEL, "default"))
        )
    return nodes


@ray.remote(max_concurrency=16)
class SchedulerActor:
    TICK_S = 0.25
    NODE_REFRESH_S = 2.0

    def __init__(self, policies_dir: str, state_dir: str) -> None:
        self._policy_file = Path(policies_dir) / "scheduler.yaml"
        self._state_dir = Path(state_dir)
        self._lock = threading.Lock()
        now = time.time()
        self._core = Scheduler(load_policy_file(self._policy_file).to_policy(), (), now)
        self._nodes: dict[str, Node] = {}
        self._grants: dict[str, LeaseGrant] = {}  # workload id -> its current lease
        self._notices: dict[str, Notice] = {}  # workload id -> pending notice
        self._submissions: dict[str, WorkloadSubmission] = {}
        self._submitted_at: dict[str, float] = {}
        self._last_node_refresh = 0.0
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scheduler-tick", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ interface
    def submit(self, submission: WorkloadSubmission) -> str:
        with self._lock:
            self._core.submit(submission.gang(), time.time())
            self._submissions[submission.workload_id] = submission
            self._submitted_at[submission.workload_id] = time.time()
        return submission.workload_id

    def lease(self, workload_id: str) -> LeaseGrant | None:
        with self._lock:
            return self._grants.get(workload_id)

    def release(self, lease_id: str, finished: bool = True) -> bool:
        with self._lock:
            released = self._core.release(lease_id, time.time(), finished=finished)
            for wid, grant in list(self._grants.items()):
                if grant.lease_id == lease_id:
                    del self._grants[wid]
                    self._notices.pop(wid, None)
            return released

    def preemption_notice(self, workload_id: str) -> Notice | None:
        with self._lock:
            return self._notices.get(workload_id)

    def report_checkpoint(self, workload_id: str) -> None:
        with self._lock:
            self._core.report_checkpoint(workload_id, time.time())

    def cancel(self, workload_id: str) -> None:
        with self._lock:
            self._core.cancel(workload_id, time.time())
            self._grants.pop(workload_id, None)
            self._notices.pop(workload_id, None)

    def status(self) -> dict[str, Any]:
        with self._lock:
            snap = self._core.snapshot(time.time())
            waiting = [p.request.workload_id for p in self._core.pending()]
        return {
            "total_gpus": snap.total_gpus,
            "free_gpus": snap.free_gpus,
            "teams": [asdict(t) for t in snap.teams],
            "pools": [asdict(p) for p in snap.pools],
            "leases": [asdict(lease) for lease in snap.leases],
            "pending": waiting,
        }

    def ping(self) -> bool:
        return True

    # ------------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._stopping.wait(self.TICK_S):
            try:
                self._tick(time.time())
            except Exception:  # a bad tick must not kill the scheduler; it is logged
                log.exception("scheduler tick failed")

    def _tick(self, now: float) -> None:
        if now - self._last_node_refresh >= self.NODE_REFRESH_S:
            self._sync_nodes(cluster_gpu_nodes(), now)
            self._last_node_refresh = now
        with self._lock:
            decisions = self._core.schedule(now)
            for start in decisions.starts:
                self._grants[start.workload_id] = self._grant(
                    start.lease_id, start.workload_id, start.team, start.placement, start.borrowing, now
                )
            for notice in decisions.notices:
                self._notices[notice.workload_id] = Notice(
                    workload_id=notice.workload_id,
                    lease_id=notice.lease_id,
                    reason=f"{notice.reason.value} for {notice.preemptor}",
                    stop_deadline=notice.stop_deadline,
                )

    def _sync_nodes(self, nodes: list[Node], now: float) -> None:
        seen = {n.name: n for n in nodes}
        with self._lock:
            for name in set(self._nodes) - set(seen):
                requeued = self._core.remove_node(name, now)
                log.warning("node %s left the cluster; requeued %s", name, requeued)
                for wid in requeued:
                    self._grants.pop(wid, None)
            for name, node in seen.items():
                if name not in self._nodes:
                    self._core.add_node(node, now)
            self._nodes = seen

    def _grant(
        self, lease_id: str, workload_id: str, team: str, placement: tuple[str, ...], borrowing: bool, now: float
    ) -> LeaseGrant:
        bundles = self._submissions[workload_id].bundles
        return LeaseGrant(
            lease_id=lease_id,
            workload_id=workload_id,
            team=team,
            granted_at=now,
            borrowing=borrowing,
            placements=tuple(
                Placement(node_id=node, node_group=self._nodes[node].node_group, gpus=gpus)
                for node, gpus in zip(placement, bundles, strict=True)
            ),
        )
