"""`--profile`'s per-step collective times from profiler events: the host ops' wall time, and
on GPU the device time of the NCCL kernels they launched (the host time of an NCCL op is
mostly its launch). Events are built by hand, in the shape torch.profiler gives them."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from torch.autograd import DeviceType

from switchyard.train.profiling import STEP_PREFIX, step_times


def event(
    name: str, start: float, end: float, device: DeviceType = DeviceType.CPU, device_us: float = 0.0, parent: Any = None
) -> Any:
    return SimpleNamespace(
        name=name,
        time_range=SimpleNamespace(start=start, end=end),
        device_type=device,
        device_time_total=device_us,
        cpu_parent=parent,
    )


def test_nccl_kernel_time_is_reported_beside_the_launch_and_counted_once() -> None:
    outer = event("c10d::allgather_", 100, 150, device_us=9_000)  # includes its child's kernels
    inner = event("nccl:all_gather", 110, 140, device_us=9_000, parent=outer)
    reduce = event("c10d::reduce_scatter_tensor_coalesced_", 300, 320, device_us=4_000)
    events = [
        event(f"{STEP_PREFIX}1", 0, 20_000),
        outer,
        inner,
        # The kernel itself, on the device timeline: it is not host time.
        event("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", 200, 9_200, device=DeviceType.CUDA),
        reduce,
        event(f"{STEP_PREFIX}2", 30_000, 31_000),
        event("c10d::allreduce_", 30_100, 30_600),  # gloo: no device time
    ]
    first, second = step_times(events)
    assert first.collectives_ms == {"all_gather": 0.05, "reduce_scatter": 0.02}
    assert first.device_collectives_ms == {"all_gather": 9.0, "reduce_scatter": 4.0}
    assert "all_gather=0.1ms (gpu 9.0ms)" in first.row()
    assert second.collectives_ms == {"all_reduce": 0.5} and second.device_collectives_ms == {}
    assert "(gpu" not in second.row()
