"""How a running job learns it must stop, and how all its ranks agree on when.

An operator (or a test) calls `channel.send_notice(job_id, reason, deadline)`; the scheduler
posts the `PreemptionNotice` it keeps with `channel.post(notice)`.
Inside the job, `PreemptionWatcher.check()` runs on every rank after the same steps, about
every `preempt_check_s` seconds: rank 0 reads the channel, any rank may have received
SIGTERM (Ray node drain, `ray job stop`, Kubernetes), and one all-reduce (MAX) of that flag
makes every rank see the same answer at the same step. The loop then checkpoints and ends
with status "preempted" (resumable). The notice and the channel contract are
`switchyard.scheduler.preemption_channel` (pure); the Ray GCS channel is
`switchyard.cluster.preemption_channel`.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import torch
import torch.distributed as dist

from switchyard.scheduler.preemption_channel import PreemptionChannel, PreemptionNotice, check_job_id

log = logging.getLogger(__name__)


class FilePreemptionChannel:
    """Notices as `<directory>/<job_id>.json`: for torchrun/local jobs and tests."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = Path(directory)

    def _path(self, job_id: str) -> Path:
        return self.directory / f"{check_job_id(job_id)}.json"

    def send_notice(self, job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice:
        notice = PreemptionNotice(job_id, reason, deadline)
        self.post(notice)
        return notice

    def post(self, notice: PreemptionNotice) -> None:
        path = self._path(notice.job_id)
        self.directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(notice.to_json())
        tmp.replace(path)  # atomic: a reader sees all of it or nothing

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
    """Decides, the same way on every rank, after which steps to check for a stop request.

    A check is one all-reduce (MAX) and one wait for it on the host, so it runs about every
    `check_every_s` seconds rather than every step: `due(step)` says whether `step` is a
    check step, and every rank answers alike because rank 0 chose that step at the previous
    check, from its own clock (the steps it expects to fit in `check_every_s`), and the
    choice travelled in that check's all-reduce. The first step is always checked (a notice
    sent before the job started is seen after one step). Rank 0 reads the channel at most
    once per `check_every_s` unless `check(force_read=True)` (a checkpoint step, where a
    notice costs no extra save). If steps slow down, a check comes late by the same factor:
    keep `check_every_s` at 1/4 of the scheduler's grace period or less.
    """

    def __init__(
        self,
        channel: PreemptionChannel | None,
        job_id: str,
        *,
        rank: int,
        device: torch.device,
        sigterm: SigtermFlag | None = None,
        check_every_s: float = 0.0,
        first_step: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`first_step`: the step training starts from (a resumed job's checkpoint step)."""
        self.channel = channel
        self.job_id = job_id
        self.rank = rank
        self.device = device
        self.sigterm = sigterm
        self.check_every_s = check_every_s
        self.clock = clock
        self._last_read = float("-inf")
        self._last_check = (clock(), first_step)  # (rank 0's time, step) of the previous check
        self._next_check_step = first_step + 1
        self._notice: PreemptionNotice | None = None

    def due(self, step: int) -> bool:
        """Whether `step` is a check step: the same answer on every rank."""
        return step >= self._next_check_step

    def _local_notice(self, force_read: bool) -> PreemptionNotice | None:
        if self._notice is None and self.sigterm is not None and self.sigterm.received.is_set():
            self._notice = PreemptionNotice(self.job_id, "SIGTERM")
        now = self.clock()
        # Only rank 0 reads the channel: one reader per job, however many ranks.
        due = force_read or now - self._last_read >= self.check_every_s
        if self._notice is None and self.channel is not None and self.rank == 0 and due:
            self._last_read = now
            self._notice = self._read_channel(self.channel)
        return self._notice

    def _read_channel(self, channel: PreemptionChannel) -> PreemptionNotice | None:
        """The channel's notice. Rank 0 must not raise here: the other ranks are about to wait
        for it in the check's all-reduce, and would hang there until the collective timed out
        (stop 44: a notice file edited by hand, or a GCS that did not answer, did that)."""
        try:
            return channel.poll(self.job_id)
        except (ValueError, KeyError, TypeError) as exc:
            # Something was posted for this job but does not read as a notice: stopping is the
            # reading that loses nothing (the job checkpoints and can be resumed).
            log.error("the preemption notice for %s cannot be read (%s); stopping as if noticed", self.job_id, exc)
            return PreemptionNotice(self.job_id, f"unreadable preemption notice ({type(exc).__name__})")
        except Exception as exc:  # noqa: BLE001 - the channel's transport (Ray's GCS, a file system): next check
            log.warning("cannot read the preemption channel for %s (%s); looking again next check", self.job_id, exc)
            self._last_read = float("-inf")
            return None

    def _next_step(self, step: int) -> int:
        """Rank 0: the step after which to check next, from its time per step since the last check."""
        now = self.clock()
        last_time, last_step = self._last_check
        self._last_check = (now, step)
        per_step = (now - last_time) / max(1, step - last_step)
        if self.check_every_s <= 0 or per_step <= 0:  # per_step 0: a clock that did not move
            return step + 1
        return step + max(1, int(self.check_every_s / per_step))

    def check(self, step: int, *, force_read: bool = False) -> PreemptionNotice | None:
        """Collective: call on every rank after the same step (a `due` one, or any step where
        all ranks call it). Returns the notice when any rank has one, on every rank."""
        local = self._local_notice(force_read)
        next_step = self._next_step(step) if self.rank == 0 else 0
        flags = torch.tensor([1 if local else 0, next_step], dtype=torch.int64, device=self.device)
        if dist.is_initialized():
            dist.all_reduce(flags, op=dist.ReduceOp.MAX)  # the stop flag, and rank 0's next step
        stop, self._next_check_step = (int(v) for v in flags.tolist())
        if not stop:
            return None
        return local or PreemptionNotice(self.job_id, "stop agreed by another rank")

    def stop_requested(self, reason: str) -> PreemptionNotice:
        """A stop every rank decided on its own, identically (e.g. a step budget)."""
        return PreemptionNotice(self.job_id, reason)
