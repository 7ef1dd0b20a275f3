"""How a running job learns it must stop, and how all its ranks agree on when.

The scheduler (or an operator) calls `channel.send_notice(job_id, reason, deadline)`.
Inside the job, `PreemptionWatcher.check()` runs once per optimizer step on every rank:
rank 0 polls the channel, any rank may have received SIGTERM (Ray node drain, `ray job
stop`, Kubernetes), and one all-reduce (MAX) of that flag makes every rank see the same
answer at the same step. The loop then checkpoints and ends with status "preempted"
(resumable). This module is pure: the Ray GCS channel lives in `ray_preemption`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Protocol

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


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


def _check_job_id(job_id: str) -> str:
    if not job_id or "/" in job_id or job_id.startswith("."):
        raise ValueError(f"invalid job id {job_id!r}")
    return job_id


class FilePreemptionChannel:
    """Notices as `<directory>/<job_id>.json`: for torchrun/local jobs and tests."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, job_id: str) -> Path:
        return self.directory / f"{_check_job_id(job_id)}.json"

    def send_notice(self, job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice:
        notice = PreemptionNotice(job_id, reason, deadline)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = self._path(job_id).with_suffix(".tmp")
        tmp.write_text(notice.to_json())
        tmp.replace(self._path(job_id))  # atomic: a reader sees all of it or nothing
        return notice

    def poll(self, job_id: str) -> PreemptionNotice | None:
        path = self._path(job_id)
        return PreemptionNotice.from_json(path.read_text()) if path.is_file() else None

    def clear(self, job_id: str) -> None:
        self._path(job_id).unlink(missing_ok=True)


class SigtermFlag:
    """Set when the process receives SIGTERM; the previous handler is restored on `close`."""

    def __init__(self) -> None:
        self.received = threading.Event()
        self._previous: signal.Handlers | int | None = None
        self.installed = False

    def install(self) -> bool:
        # Signal handlers can only be set from the main thread; Ray Train runs the loop in
        # another thread, where the GCS channel carries the drain notice instead.
        if threading.current_thread() is not threading.main_thread():
            log.info("SIGTERM handler not installed: training loop is not on the main thread")
            return False
        self._previous = signal.signal(signal.SIGTERM, self._handle)  # type: ignore[assignment]
        self.installed = True
        return True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        log.warning("SIGTERM received: checkpointing at the next step, then exiting")
        self.received.set()

    def close(self) -> None:
        if self.installed:
            signal.signal(signal.SIGTERM, self._previous or signal.SIG_DFL)
            self.installed = False


class PreemptionWatcher:
    """Call `check()` on every rank once per step; all ranks get the same answer."""

    def __init__(
        self,
        channel: PreemptionChannel | None,
        job_id: str,
        *,
        rank: int,
        device: torch.device,
        sigterm: SigtermFlag | None = None,
        min_poll_interval_s: float = 0.0,
    ) -> None:
        self.channel = channel
        self.job_id = job_id
        self.rank = rank
        self.device = device
        self.sigterm = sigterm
        self.min_poll_interval_s = min_poll_interval_s
        self._last_poll = float("-inf")
        self._notice: PreemptionNotice | None = None

    def _local_notice(self) -> PreemptionNotice | None:
        if self._notice is None and self.sigterm is not None and self.sigterm.received.is_set():
            self._notice = PreemptionNotice(self.job_id, "SIGTERM")
        now = time.monotonic()
        # Only rank 0 polls: one reader per job, however many ranks.
        due = now - self._last_poll >= self.min_poll_interval_s
        if self._notice is None and self.channel is not None and self.rank == 0 and due:
            self._last_poll = now
            self._notice = self.channel.poll(self.job_id)
        return self._notice

    def check(self) -> PreemptionNotice | None:
        local = self._local_notice()
        flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if not int(flag.item()):
            return None
        return local or PreemptionNotice(self.job_id, "stop agreed by another rank")

    def stop_requested(self, reason: str) -> PreemptionNotice:
        """A stop every rank decided on its own, identically (e.g. a step budget)."""
        return PreemptionNotice(self.job_id, reason)
