"""The preemption notice, one type wherever it is (kept by the scheduler, on a channel, in the
job), and the channel contract.

A `PreemptionNotice` asks a job to checkpoint and exit resumable. The live scheduler keeps the
notices it sent (`LiveState.notices`), answers `preemption_notice()` with them and posts each
to the job's channel; an operator, a drain hook or the job's own driver on SIGTERM posts one
too (those have no lease). A channel is where notices are posted and where the job's rank 0
reads them. Both sides import this module, so it stays pure (no Ray, no torch): the Ray GCS
channel is `switchyard.cluster.preemption_channel`, the file channel and the watcher that reads
a channel inside the job are `switchyard.train.preemption`. The policy core's decision to put
a lease under notice (victim rank, GPU-seconds lost) is `switchyard.scheduler.core.PreemptionDecision`.

The wire form is `to_json`: a JSON object of the fields. `from_json` reads what older code
wrote too (it had no `lease_id`).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class PreemptionNotice:
    """A request to stop job `job_id`: checkpoint, then exit resumable."""

    job_id: str
    """The channel key: for the scheduler's notices, the workload id."""
    reason: str
    deadline: float | None = None
    """Unix time by which the job should have exited (the scheduler stops it then); None: no hard deadline."""
    sent_at: float = field(default_factory=time.time)
    lease_id: str | None = None
    """The lease the scheduler put under notice; None for a notice not from the scheduler (an
    operator's, SIGTERM)."""

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> PreemptionNotice:
        data = json.loads(raw)
        return cls(
            job_id=str(data["job_id"]),
            reason=str(data["reason"]),
            deadline=None if data.get("deadline") is None else float(data["deadline"]),
            sent_at=float(data["sent_at"]),
            lease_id=None if data.get("lease_id") is None else str(data["lease_id"]),  # absent before it existed
        )


class PreemptionChannel(Protocol):
    """Where notices are posted (by the scheduler) and read (by the job's rank 0)."""

    def send_notice(self, job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice:
        """Post a new notice (sent now, no lease) for `job_id`; returns it."""
        ...

    def post(self, notice: PreemptionNotice) -> None:
        """Post `notice` as it is, for `notice.job_id` (replacing one posted before)."""
        ...

    def poll(self, job_id: str) -> PreemptionNotice | None: ...

    def clear(self, job_id: str) -> None: ...


def check_job_id(job_id: str) -> str:
    """`job_id`, if a channel can hold it (it names a file or a key); ValueError if not."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id
