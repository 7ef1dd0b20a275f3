"""Launch admitted workloads as Ray jobs (so they show in the dashboard's Jobs tab), and stop them.

The job learns which workload it is from `SWITCHYARD_WORKLOAD_ID`; at start it claims the
lease the scheduler already granted (see `switchyard.cluster.admission`) and pins its
workers to the granted nodes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ray.job_submission import JobStatus, JobSubmissionClient

log = logging.getLogger(__name__)

WORKLOAD_ENV = "SWITCHYARD_WORKLOAD_ID"
LEASE_ENV = "SWITCHYARD_LEASE_ID"


@dataclass(frozen=True)
class LaunchedJob:
    workload_id: str
    submission_id: str


class JobLauncher:
    def __init__(self, dashboard_url: str) -> None:
        self.dashboard_url = dashboard_url
        self._client: JobSubmissionClient | None = None

    @property
    def client(self) -> JobSubmissionClient:
        if self._client is None:  # created lazily: the dashboard may start after the actor
            self._client = JobSubmissionClient(self.dashboard_url)
        return self._client

    def launch(
        self, workload_id: str, lease_id: str, attempt: int, entrypoint: str, runtime_env: dict[str, Any] | None
    ) -> LaunchedJob:
        env = dict((runtime_env or {}).get("env_vars", {}))
        env.update({WORKLOAD_ENV: workload_id, LEASE_ENV: lease_id})
        submission_id = f"{workload_id}-{attempt}"
        self.client.submit_job(
            entrypoint=entrypoint,
            submission_id=submission_id,
            runtime_env={**(runtime_env or {}), "env_vars": env},
            metadata={"switchyard_workload": workload_id, "switchyard_lease": lease_id},
        )
        log.info("launched workload %s as Ray job %s", workload_id, submission_id)
        return LaunchedJob(workload_id, submission_id)

    def stop(self, job: LaunchedJob) -> bool:
        try:
            return bool(self.client.stop_job(job.submission_id))
        except RuntimeError as exc:  # the job is already gone: nothing to stop
            log.info("stop %s: %s", job.submission_id, exc)
            return False

    def stop_ray_job(self, ray_job_id: str) -> str | None:
        """Stop the submitted job whose driver runs as Ray job `ray_job_id`; returns its submission
        id, or None when that Ray job is not a submitted one (a driver started by hand)."""
        for info in self.client.list_jobs():
            submission_id: str | None = info.submission_id
            if info.job_id == ray_job_id and submission_id is not None:
                if info.status in (JobStatus.PENDING, JobStatus.RUNNING):
                    self.client.stop_job(submission_id)
                return submission_id
        return None

    def statuses(self) -> dict[str, JobStatus]:
        """Every submitted job's status, by submission id (one Jobs API call)."""
        return {info.submission_id: info.status for info in self.client.list_jobs() if info.submission_id}

    def status(self, job: LaunchedJob) -> JobStatus | None:
        try:
            return self.client.get_job_status(job.submission_id)
        except RuntimeError as exc:
            log.warning("status of %s unavailable: %s", job.submission_id, exc)
            return None
