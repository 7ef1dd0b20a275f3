"""The trainer on one GPU: throughput, MFU, prefetch, torch.compile, memory against the planner.

    python bench/gpu_check.py --section fsdp|prefetch|compile [--cpu]   (what gpu_check.sh runs)
    python bench/gpu_check.py --cpu                                      (every section: smoke)

One process, world size 1, no Ray, nothing from the network. On a GPU: the `1b` preset
(0.997B parameters), bf16 FSDP2 (`fsdp-full`), seq 2048, micro-batch 8, through the
trainer's own `build_model` / `build_engine` and its batch feed. `--cpu` runs the same code
on the `tiny` preset in fp32 over gloo, in seconds: it proves the script runs, not a number.

Sections, each printing its rows as it finishes:
- fsdp: step time, tokens/s, MFU (model FLOPs from the planner's formula over the declared
  peak) and peak allocated memory against the planner's prediction for the same job;
- prefetch: the trainer's feed (batch thread pinning + `DevicePrefetcher` side-stream copies)
  against copying pageable batches on the compute stream inside the step;
- compile: `parallel.compile` off and on: first-step (compile) time, step time, and the
  largest relative loss difference over the same steps from the same weights.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))
from switchyard.train.batch_thread import BackgroundBatches
from switchyard.train.data import TokenBatches, load_tokens
from switchyard.train.engine import Batch, TrainEngine
from switchyard.train.loop import build_engine, build_model, pin_on_gpu, step_batches
from switchyard.train.memory import peak_memory
from switchyard.train.plan import ClusterSpec, plan
from switchyard.train.plan.from_spec import spec_input
from switchyard.train.prefetch import DevicePrefetcher
from switchyard.train.spec import JobSpec
from switchyard.train.step_metrics import step_cost

SECTIONS = ("fsdp", "prefetch", "compile")
H200_MEMORY_GIB = 141.0
H200_PEAK_TFLOPS = 989.0
"""H200 SXM: the same dense bf16 peak as H100 SXM."""
StepFeed = Iterator[tuple[dict[str, Any], list[Batch]]]


def job_spec(cpu: bool, compiled: bool = False) -> JobSpec:
    model = {"preset": "tiny", "overrides": {"max_seq_len": 32}} if cpu else {"preset": "1b"}
    data = {"seq_len": 32, "micro_batch_size": 2} if cpu else {"seq_len": 2048, "micro_batch_size": 8}
    return JobSpec.model_validate(
        {
            "name": "gpu-check",
            "steps": 1000,
            "num_workers": 1,
            "use_gpu": not cpu,
            "peak_tflops_per_device": None if cpu else H200_PEAK_TFLOPS,
            "model": model,
            "data": {**data, "synthetic_bytes": 20_000 if cpu else 600_000},
            "parallel": {"strategy": "fsdp-full", "precision": "fp32" if cpu else "bf16", "compile": compiled},
        }
    )


class Bench:
    """The engine and the batches of one run of `spec` on this process's device."""

    def __init__(self, spec: JobSpec, device: torch.device) -> None:
        self.spec, self.device = spec, device
        torch.manual_seed(spec.seed)
        self.engine: TrainEngine = build_engine(build_model(spec, device, None), spec, device, 1)
        data = spec.data
        cache = Path(tempfile.mkdtemp(prefix="gpu-check-"))
        tokens = load_tokens(
            data.source,
            synthetic_bytes=data.synthetic_bytes,
            seed=spec.seed,
            cache_dir=cache,
            vocab_size=spec.model.gpt_config().vocab_size,
        )
        self.batches = TokenBatches(tokens, data.seq_len, data.micro_batch_size, 0, 1, spec.seed)

    def sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def run(self, feed: StepFeed, steps: int) -> tuple[list[float], list[float]]:
        """Per-step wall seconds (the device finished each step) and losses."""
        times, losses = [], []
        for _ in range(steps):
            started = time.perf_counter()
            _, micro = next(feed)
            loss = self.engine.train_step(micro, 3e-4).loss
            value = float(loss.item())  # waits for the device
            times.append(time.perf_counter() - started)
            losses.append(value)
        return times, losses

    def trainer_feed(self) -> tuple[StepFeed, BackgroundBatches[Any]]:
        thread = BackgroundBatches(step_batches(self.batches, 1), depth=2, prepare=pin_on_gpu(self.device))
        return DevicePrefetcher(thread, self.device), thread

    def inline_feed(self) -> StepFeed:
        """Pageable batches copied on the compute stream inside the step: no overlap."""
        for state, micro in step_batches(self.batches, 1):
            yield state, [(x.to(self.device), y.to(self.device)) for x, y in micro]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def row(*cells: object) -> None:
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def throughput_cells(spec: JobSpec, step_s: float) -> list[str]:
    cost = step_cost(spec, 1)
    mfu = cost.mfu(step_s)
    return [f"{step_s * 1000:.1f}", f"{cost.tokens_per_step / step_s:,.0f}", "-" if mfu is None else f"{mfu:.1%}"]


def planned_bytes(spec: JobSpec, cpu: bool) -> int:
    given = spec_input(spec)
    cluster = ClusterSpec(gpus=1, gpus_per_node=1)
    if not cpu:
        cluster = ClusterSpec(gpus=1, gpus_per_node=1, gpu_memory_gib=H200_MEMORY_GIB, peak_tflops=H200_PEAK_TFLOPS)
    return int(plan(given.shape, cluster, given.job).total.value)


def section_fsdp(cpu: bool, device: torch.device, warmup: int, steps: int) -> None:
    spec = job_spec(cpu)
    bench = Bench(spec, device)
    feed, thread = bench.trainer_feed()
    with thread:
        bench.run(feed, warmup)
        times, _ = bench.run(feed, steps)
    memory, planned = peak_memory(device), planned_bytes(spec, cpu)
    ratio = memory.bytes / planned
    row(
        "fsdp",
        "bf16 fsdp-full" if not cpu else "fp32 fsdp-full (cpu)",
        *throughput_cells(spec, median(times)),
        f"{memory.bytes / 2**30:.2f} GiB {memory.kind}",
        f"planner {planned / 2**30:.2f} GiB (x{ratio:.2f})",
    )


def section_prefetch(cpu: bool, device: torch.device, warmup: int, steps: int) -> None:
    spec = job_spec(cpu)
    bench = Bench(spec, device)
    inline = bench.inline_feed()
    bench.run(inline, warmup)
    off, _ = bench.run(inline, steps)
    row("prefetch", "off: pageable copy in the step", *throughput_cells(spec, median(off)), "", "")
    feed, thread = bench.trainer_feed()
    with thread:
        bench.run(feed, warmup)
        on, _ = bench.run(feed, steps)
    saved = (median(off) - median(on)) * 1000
    row("prefetch", "on: batch thread + side stream", *throughput_cells(spec, median(on)), "", f"{saved:+.2f} ms/step")


def section_compile(cpu: bool, device: torch.device, warmup: int, steps: int) -> None:
    losses = {}
    for compiled in (False, True):
        spec = job_spec(cpu, compiled=compiled)
        bench = Bench(spec, device)
        feed, thread = bench.trainer_feed()
        with thread:
            first, _ = bench.run(feed, 1)  # compiles forward and backward when compiled
            bench.run(feed, warmup)
            times, losses[compiled] = bench.run(feed, steps)
        name = "on: each block" if compiled else "off: eager"
        row("compile", name, *throughput_cells(spec, median(times)), f"first step {first[0]:.1f} s", "")
        del bench, feed, thread
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses[True], losses[False], strict=True))
    row("compile", "losses on vs off", "", "", "", "", f"max relative difference {worst:.1e}")


RUNS = {"fsdp": section_fsdp, "prefetch": section_prefetch, "compile": section_compile}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--section", choices=SECTIONS, action="append", help="default: every section")
    parser.add_argument("--cpu", action="store_true", help="tiny model, fp32, gloo: a smoke run of the code")
    parser.add_argument("--warmup", type=int, help="untimed steps (default: 3 on GPU, 1 with --cpu)")
    parser.add_argument("--steps", type=int, help="timed steps (default: 10 on GPU, 2 with --cpu)")
    parser.add_argument("--header", action="store_true", help="print the table header first")
    args = parser.parse_args()
    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device (use --cpu for the smoke run)", file=sys.stderr)
        return 2
    device = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    warmup = args.warmup if args.warmup is not None else (1 if args.cpu else 3)
    steps = args.steps if args.steps is not None else (2 if args.cpu else 10)
    if args.header:
        row("section", "setting", "step ms", "tokens/s", "MFU", "memory", "note")
        row(*["---"] * 7)
    with tempfile.TemporaryDirectory() as rendezvous:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method=f"file://{rendezvous}/pg", rank=0, world_size=1)
        try:
            for name in args.section or SECTIONS:
                RUNS[name](args.cpu, device, warmup, steps)
        finally:
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
