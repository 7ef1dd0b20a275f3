"""A hung Ray dashboard does not stop the scheduler.

The scheduler reads Serve's replicas through Ray's state API and launches and stops jobs
through the Jobs API, both served by the dashboard, a single process that large clusters are
known to overload. The test stops the session cluster's dashboard (SIGSTOP: its port still
accepts connections, and nothing answers), as a hung one behaves.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import ray
from ray._private import ray_constants
from ray.job_submission import JobSubmissionClient

from switchyard.scheduler.api import WorkloadSubmission

from .conftest import wait_for, whole_node_inference

# Inference waits at most this long for a decision while the dashboard hangs: a few ticks and
# passes, well under the state API's 30 s request timeout.
PROMPT_S = 10.0


@contextmanager
def hung_dashboard(ray_cluster: dict[str, Any]) -> Iterator[None]:
    [dashboard] = ray_cluster["cluster"].head_node.all_processes[ray_constants.PROCESS_TYPE_DASHBOARD]
    os.kill(dashboard.process.pid, signal.SIGSTOP)
    try:
        yield
    finally:  # the rest of the session needs it
        os.kill(dashboard.process.pid, signal.SIGCONT)


def test_a_hung_dashboard_delays_no_admission_and_loses_no_launch(
    scheduler_factory: Callable[..., Any], ray_cluster: dict[str, Any]
) -> None:
    actor = scheduler_factory()
    launched = WorkloadSubmission(
        team="research",
        bundles=(8,),
        priority_class="exploratory",
        entrypoint=f"{sys.executable} -c 'print(\"launched\")'",
    )
    [inference] = whole_node_inference(1)
    with hung_dashboard(ray_cluster):
        time.sleep(2)  # the scheduler's periodic reads of the dashboard are under way
        ray.get(actor.submit.remote(launched))
        wait_for(lambda: ray.get(actor.lease.remote(launched.workload_id)), timeout=PROMPT_S)
        # Its launch waits for the dashboard. The next admission does not.
        submitted = time.monotonic()
        ray.get(actor.submit.remote(inference))
        wait_for(lambda: ray.get(actor.lease.remote(inference.workload_id)), timeout=PROMPT_S)
        waited = time.monotonic() - submitted
        assert ray.get(actor.status.remote(), timeout=PROMPT_S)["jobs_api_backlog"] >= 1
    # Once the dashboard answers, the launch it held back is carried out.
    jobs = JobSubmissionClient(ray_cluster["dashboard_url"])

    def launched_job() -> Any:
        return next(
            (j for j in jobs.list_jobs() if (j.metadata or {}).get("switchyard_workload") == launched.workload_id),
            None,
        )

    assert wait_for(launched_job, timeout=60), "the held-back launch was never carried out"
    assert waited < PROMPT_S, waited
