"""`--profile`: a torch.profiler trace per rank, and per step the time spent in collectives
(all-gather, reduce-scatter, all-reduce) against everything else (compute).

Collective time is the wall time of the c10d / NCCL / gloo ops the profiler records on the
host (launch plus any wait on them). With NCCL that is mostly the launch, so on GPU each
collective's kernel time on the device is reported beside it (`gpu`), from the kernels the
profiler correlates with the host op; overlap with compute is visible in the trace.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

log = logging.getLogger(__name__)

COLLECTIVE_KINDS = {
    "all_gather": ("all_gather", "allgather", "_allgather_base"),
    "reduce_scatter": ("reduce_scatter", "reducescatter", "_reduce_scatter_base"),
    "all_reduce": ("all_reduce", "allreduce"),
}
STEP_PREFIX = "switchyard_step_"


def collective_kind(name: str) -> str | None:
    lowered = name.lower()
    for kind, needles in COLLECTIVE_KINDS.items():
        if any(n in lowered for n in needles):
            return kind
    return None


@dataclass
class StepTimes:
    step: int
    total_ms: float
    collectives_ms: dict[str, float] = field(default_factory=dict)
    device_collectives_ms: dict[str, float] = field(default_factory=dict)  # kernel time on the GPU

    @property
    def compute_ms(self) -> float:
        return max(0.0, self.total_ms - sum(self.collectives_ms.values()))

    def row(self) -> str:
        parts = " ".join(f"{k}={self.collectives_ms.get(k, 0.0):.1f}ms{self._on_device(k)}" for k in COLLECTIVE_KINDS)
        return f"step {self.step}: total={self.total_ms:.1f}ms {parts} compute={self.compute_ms:.1f}ms"

    def _on_device(self, kind: str) -> str:
        return f" (gpu {self.device_collectives_ms[kind]:.1f}ms)" if kind in self.device_collectives_ms else ""


def _merged_ms(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of intervals (us -> ms): nested ops must not count twice."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1000.0


def step_times(events: list[Any]) -> list[StepTimes]:
    """Split profiler events into steps (by our step ranges) and sum collectives per step: the
    host ops' wall time, and on GPU the device time of the kernels they launched."""
    steps = [e for e in events if e.name.startswith(STEP_PREFIX)]
    host_ops = [e for e in events if e.device_type == DeviceType.CPU and collective_kind(e.name)]
    out = []
    for s in sorted(steps, key=lambda e: e.time_range.start):
        start, end = s.time_range.start, s.time_range.end
        by_kind: dict[str, list[tuple[float, float]]] = {}
        on_device: dict[str, float] = {}
        for e in host_ops:
            if not (start <= e.time_range.start and e.time_range.end <= end):
                continue
            kind = collective_kind(e.name)
            assert kind is not None
            by_kind.setdefault(kind, []).append((e.time_range.start, e.time_range.end))
            device_us = e.device_time_total  # its kernels and its children's
            if device_us and not _inside_a_collective(e):  # nested c10d/nccl ops count once
                on_device[kind] = on_device.get(kind, 0.0) + device_us / 1000.0
        out.append(
            StepTimes(
                int(s.name[len(STEP_PREFIX) :]),
                (end - start) / 1000.0,
                {k: _merged_ms(v) for k, v in by_kind.items()},
                on_device,
            )
        )
    return out


def _inside_a_collective(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if collective_kind(parent.name):
            return True
        parent = parent.cpu_parent
    return False


class StepProfiler:
    """Profiles the steps run inside `step(n)`; does nothing when `directory` is None."""

    def __init__(self, directory: Path | None, rank: int) -> None:
        self.directory = directory
        self.rank = rank
        self._profile: profile | None = None
        self.times: list[StepTimes] = []

    def __enter__(self) -> StepProfiler:
        if self.directory is not None:
            activities = [ProfilerActivity.CPU]
            if torch.cuda.is_available():
                activities.append(ProfilerActivity.CUDA)
            self._profile = profile(activities=activities)
            self._profile.__enter__()
        return self

    @contextlib.contextmanager
    def step(self, n: int) -> Iterator[None]:
        if self._profile is None:
            yield
            return
        with record_function(f"{STEP_PREFIX}{n}"):
            yield

    def __exit__(self, *exc: object) -> None:
        if self._profile is None or self.directory is None:
            return
        self._profile.__exit__(None, None, None)
        self.directory.mkdir(parents=True, exist_ok=True)
        trace = self.directory / f"trace-rank{self.rank}.json"
        self._profile.export_chrome_trace(str(trace))
        self.times = step_times(list(self._profile.events()))
        if self.rank == 0:
            for t in self.times:
                print(t.row(), flush=True)
            print(f"profile trace: {trace}", flush=True)
