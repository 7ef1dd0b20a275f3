"""The scheduler actor's audit thread's Ray I/O: which launched jobs ended, who holds GPUs.

Every `AUDIT_S` the actor asks two things of Ray, off its lock (the Jobs API and the state API
are slow under load, and neither may delay an admission):

- which of the jobs it launched, and that still hold a claimed lease, have ended (a crash, or
  a release lost with the process): the actor then logs `job_exited` for each, and the driver
  releases the lease on the job's behalf;
- which Ray jobs hold GPUs, against the leases (`enforcement`): use outside any lease and use
  beyond a lease are logged and exported, and with `stop_unleased_gpus` the holder is stopped.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass

from switchyard.cluster.enforcement import GpuAccounting, account, stop_unleased
from switchyard.cluster.job_launcher import JobLauncher
from switchyard.cluster.scheduler_metrics import SchedulerMetrics

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class EndedJob:
    workload_id: str
    submission_id: str
    status: str


class GpuAudit:
    def __init__(self, launcher: JobLauncher | None, metrics: SchedulerMetrics, stop_unleased_gpus: bool) -> None:
        self._launcher = launcher
        self._metrics = metrics
        self._stop_unleased = stop_unleased_gpus

    def ended_jobs(self, watched: Mapping[str, str]) -> list[EndedJob]:
        """Of the launched jobs `watched` (submission id -> workload), those that have ended."""
        if self._launcher is None or not watched:
            return []
        statuses = self._launcher.statuses()
        ended = []
        for submission_id, workload in watched.items():
            status = statuses.get(submission_id)
            if status is not None and status.is_terminal():
                log.warning("workload %s: its Ray job %s ended (%s) holding its lease", workload, submission_id, status)
                ended.append(EndedJob(workload, submission_id, status.value))
        return ended

    def gpu_use(self, gcs_address: str, leased: dict[str, int]) -> GpuAccounting:
        """Who holds GPUs against the leases (Ray job id -> GPUs leased); reported, exported and,
        when configured, enforced."""
        accounting = account(gcs_address, leased)
        self._metrics.unleased_gpus.set(accounting.unleased_gpus)
        self._metrics.over_lease_gpus.set(accounting.over_lease_gpus)
        for over in accounting.over_lease:
            log.warning(
                "Ray job %s holds %.0f GPUs, %.0f more than its leases grant",
                over.holding.job_id,
                over.holding.gpus,
                over.excess_gpus,
            )
        for holding in accounting.unleased:
            log.warning("GPU use outside any lease: Ray job %s holds %.0f GPUs", holding.job_id, holding.gpus)
            if self._stop_unleased:
                for action in stop_unleased(holding):
                    log.warning("enforcement: %s (job %s)", action, holding.job_id)
                # Removing its placement groups frees the GPUs now, but Ray Train would retry
                # forever with new ones: a submitted job is stopped as a whole.
                if self._launcher is not None:
                    stopped = self._launcher.stop_ray_job(holding.job_id)
                    if stopped is not None:
                        log.warning("enforcement: stopped Ray job %s (%s)", stopped, holding.job_id)
        return accounting
