"""The scheduler's notice to a job, as it travels: the wire form and the channel contract.

A channel is where the scheduler (or an operator) posts `PreemptionNotice`s and where the
job's rank 0 reads them. Both sides import this module, so it stays pure (no Ray, no
torch): the Ray GCS channel is `switchyard.cluster.preemption_channel`, the file channel
and the watcher that reads a channel inside the job are `switchyard.train.preemption`.
This `PreemptionNotice` is what a job sees; the core's own, richer notice (victim rank,
GPU-seconds lost) is `switchyard.scheduler.core.PreemptionNotice`.
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
    reason: str
    deadline: float | None = None
    """Unix time by which the job should have exited; None: no hard deadline."""
    sent_at: float = field(default_factory=time.time)

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
        )


class PreemptionChannel(Protocol):
    """Where notices are posted (by the scheduler) and read (by the job's rank 0)."""

    def send_notice(self, job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice: ...

    def poll(self, job_id: str) -> PreemptionNotice | None: ...

    def clear(self, job_id: str) -> None: ...


def check_job_id(job_id: str) -> str:
    """`job_id`, if a channel can hold it (it names a file or a key); ValueError if not."""
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id
