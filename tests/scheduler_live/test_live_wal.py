"""An acknowledged mutation survives SIGKILL of the scheduler actor's process (the write-ahead log)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from typing import Any

import pytest

from switchyard.cluster.scheduler_client import SchedulerClient
from switchyard.scheduler.api import WorkloadSubmission
from tests.scheduler_live.conftest import wait_for

pytestmark = pytest.mark.ray


def kill_and_wait_for_restart(client: SchedulerClient) -> float:
    """SIGKILL the actor's process (no clean shutdown, no final snapshot); returns seconds to
    the first call the new incarnation answered."""
    incarnation, pid = client.ping(), client.pid()
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: client.ping() != incarnation, timeout=20, every=0.05)
    return time.monotonic() - killed_at


def test_acknowledged_submit_and_claim_survive_sigkill(scheduler_factory: Callable[..., Any]) -> None:
    client = SchedulerClient.of_handle(scheduler_factory())
    running = WorkloadSubmission(team="research", bundles=(8,))
    client.submit(running)
    grant = wait_for(lambda: client.lease(running.workload_id))
    assert client.claim(running.workload_id, "job-running") == grant
    queued = WorkloadSubmission(team="vision", bundles=(8, 8))  # two whole nodes: one is taken, so it waits
    client.submit(queued)  # acknowledged: its log line is synced, the next thing is the kill

    recovered_s = kill_and_wait_for_restart(client)

    rows = {r["workload_id"]: r for r in client.list_workloads()}
    assert rows[queued.workload_id]["state"] == "queued"
    assert client.lease(running.workload_id) == grant
    assert client.claim(running.workload_id, "job-running") == grant  # a retried claim: the same grant
    assert client.release(grant.lease_id, True) is False
    assert client.release(grant.lease_id, True) is False  # and a retried release its first answer
    assert recovered_s <= 5.0
