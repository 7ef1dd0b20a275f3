"""Does the batch prefetcher overlap host-to-device copies with compute? (GPU machine only)

    .venv/bin/python bench/gpu_overlap.py [--batches 20] [--mb 64]

1. overlap: `DevicePrefetcher` feeding a matmul-heavy step; torch.profiler records copy
   (Memcpy HtoD) and compute kernels; prints the fraction of copy time that ran while a
   compute kernel was running on another stream. Pinned vs pageable source memory.
2. wrong-stream bugs, each run deliberately and caught by a checksum:
   a. no `wait_event`: compute reads the buffer before the side-stream copy lands;
   b. no `record_stream`: the buffer is freed on the copy stream while compute still
      reads it, the allocator hands it to the next copy, and compute sees the new data.
3. `cudaStreamSynchronize` (one stream) vs `cudaDeviceSynchronize` (every stream) with
   long work queued on a second stream.
Without CUDA it says so and exits 0 (CPU machines run the CPU tests instead).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
from switchyard.train.prefetch import DevicePrefetcher


def _intervals(prof: profile, want_copy: bool) -> list[tuple[float, float]]:
    out = []
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        is_copy = "memcpy" in e.name.lower() and "htod" in e.name.lower()
        if is_copy == want_copy and e.time_range.end > e.time_range.start:
            out.append((e.time_range.start, e.time_range.end))
    return out


def _overlap_fraction(copies: list[tuple[float, float]], kernels: list[tuple[float, float]]) -> float:
    total = sum(b - a for a, b in copies) or 1.0
    overlapped = 0.0
    for a, b in copies:
        for c, d in kernels:
            overlapped += max(0.0, min(b, d) - max(a, c))
    return min(1.0, overlapped / total)


def overlap(batches: int, mb: int, pinned: bool) -> None:
    dev = torch.device("cuda")
    n = mb * 1024 * 1024 // 4
    source = [torch.randn(n) for _ in range(batches)]
    if pinned:
        source = [t.pin_memory() for t in source]
    weight = torch.randn(4096, 4096, device=dev)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for batch in DevicePrefetcher(iter(source), dev):
            x = weight
            for _ in range(8):  # compute long enough to hide one copy
                x = torch.tanh(x @ weight)
            batch.sum()
        torch.cuda.synchronize()
    frac = _overlap_fraction(_intervals(prof, True), _intervals(prof, False))
    print(
        f"overlap ({'pinned' if pinned else 'pageable'} source, {mb} MB batches): "
        f"{frac:.0%} of HtoD copy time ran under compute"
    )


def bug_no_wait_event(mb: int) -> None:
    dev = torch.device("cuda")
    side = torch.cuda.Stream()
    host = torch.full((mb * 1024 * 1024 // 4,), 7.0).pin_memory()
    stale = 0
    for _ in range(20):
        with torch.cuda.stream(side):
            buf = host.to(dev, non_blocking=True)
        # BUG: no torch.cuda.current_stream().wait_event(...): compute may run first.
        got = buf.sum().item() / buf.numel()
        stale += got != 7.0
        torch.cuda.synchronize()
    print(f"bug a (no wait_event): {stale}/20 reads saw the buffer before the copy landed")


def bug_no_record_stream(mb: int) -> None:
    dev = torch.device("cuda")
    side = torch.cuda.Stream()
    weight = torch.randn(4096, 4096, device=dev)
    corrupted = 0
    for i in range(20):
        with torch.cuda.stream(side):
            buf = torch.full((mb * 1024 * 1024 // 4,), float(i)).pin_memory().to(dev, non_blocking=True)
            ready = torch.cuda.Event()
            ready.record(side)
        torch.cuda.current_stream().wait_event(ready)
        x = weight
        for _ in range(8):
            x = x @ weight  # keep compute busy so the later read is still queued
        total = buf.sum()  # queued on compute; BUG: no buf.record_stream(compute)
        del buf  # freed "on" the side stream: the allocator may reuse it at once
        with torch.cuda.stream(side):
            torch.full((mb * 1024 * 1024 // 4,), -1.0, device=dev)  # reuses the block
        corrupted += total.item() != float(i) * (mb * 1024 * 1024 // 4)
        torch.cuda.synchronize()
    print(f"bug b (no record_stream): {corrupted}/20 results read reused memory")


def sync_timing() -> None:
    dev = torch.device("cuda")
    other = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device=dev)
    for label, sync in (
        ("cudaStreamSynchronize (current stream)", torch.cuda.current_stream().synchronize),
        ("cudaDeviceSynchronize (all streams)", torch.cuda.synchronize),
    ):
        torch.cuda.synchronize()
        with torch.cuda.stream(other):
            for _ in range(20):
                a @ a  # long work on another stream
        torch.ones(1, device=dev)  # trivial work on the current stream
        t0 = time.perf_counter()
        sync()
        print(f"{label}: {1000 * (time.perf_counter() - t0):.2f} ms")
    torch.cuda.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--mb", type=int, default=64)
    args = parser.parse_args()
    print(f"command: .venv/bin/python bench/gpu_overlap.py --batches {args.batches} --mb {args.mb}")
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to measure here (run on a GPU machine)")
        return 0
    print(f"device: {torch.cuda.get_device_name()}, torch {torch.__version__}")
    overlap(args.batches, args.mb, pinned=True)
    overlap(args.batches, args.mb, pinned=False)
    bug_no_wait_event(args.mb)
    bug_no_record_stream(args.mb)
    sync_timing()
    return 0


if __name__ == "__main__":
    sys.exit(main())
