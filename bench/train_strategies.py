"""Step time, per-rank bytes and checkpoint save/restore time per strategy, on CPU ranks.

    .venv/bin/python bench/train_strategies.py [--nproc 2] [--preset small] [--steps 8]

Prints one table per section, with ratios to DDP:
  1. strategies (ddp, fsdp-*, zero*): step time, parameter/gradient/optimizer bytes per rank,
     collectives per step (all-gather, reduce-scatter, reduce, all-reduce)
  2. FSDP wrapping granularity (block | layer | root): step time, all-gathers per step,
     peak parameter bytes during forward (shards + the unsharded units) and right after it
  3. activation checkpointing (none | every-k | selective | full) under fsdp-full and
     fsdp-grad-op: step time, bytes saved for backward, all-gathers per step
  4. checkpoint save and restore time (DCP / DeepSpeed)
Each group of ranks first runs one throw-away job (lazy initialisation). The first 2 steps
of each job run under torch.profiler (collective counts) and a saved-tensor hook (bytes
saved for backward); step time is the median of the later, unobserved steps. Peak RSS is not reported: on CPU it is
dominated by the runtime (~1.3 GB whatever the strategy) and cannot show sharding.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from switchyard.train.checkpoint import CheckpointStore  # noqa: E402
from switchyard.train.engine import TrainEngine  # noqa: E402
from switchyard.train.launch import spawn_group  # noqa: E402
from switchyard.train.loop import RunContext, Trainer  # noqa: E402
from switchyard.train.memory import param_bytes  # noqa: E402
from switchyard.train.profiling import collective_kind  # noqa: E402
from switchyard.train.spec import JobSpec  # noqa: E402

WARMUP = 2


def make_spec(preset: str, steps: int, **changes: Any) -> JobSpec:
    base = JobSpec.model_validate(
        {
            "name": "bench",
            "steps": steps,
            "model": {"preset": preset},
            "data": {"seq_len": 128, "micro_batch_size": 4, "synthetic_bytes": 400_000},
            "optim": {"warmup_steps": 2},
            "checkpoint": {"resume": False, "save_final": False},
        }
    )
    return base.with_changes(**changes)


class SavedBytes:
    """Bytes of tensors autograd keeps for backward (what activation checkpointing saves)."""

    def __init__(self) -> None:
        self.total = 0

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.total += t.numel() * t.element_size()
        return t


def _kind(name: str) -> str | None:
    # DeepSpeed's ZeRO-1/2 reduce-scatter is one `reduce` per owning rank (c10d::reduce_).
    return collective_kind(name) or ("reduce" if name == "c10d::reduce_" else None)


def measure(rank: int, world: int, spec: JobSpec, work: Path) -> dict[str, Any]:
    """Train `spec`; the first WARMUP steps run under the profiler and the saved-tensor
    counter (counts per step), the rest unobserved (step times)."""
    engines: list[TrainEngine] = []
    stamps: list[float] = []
    saved = SavedBytes()
    prof = profile(activities=[ProfilerActivity.CPU])
    hooks = torch.autograd.graph.saved_tensors_hooks(saved.pack, lambda t: t)

    peak = [0]

    def track_peak(module: torch.nn.Module, args: object, output: object) -> None:
        if len(stamps) < 1:  # first step only: FSDP's unsharded units are visible here
            peak[0] = max(peak[0], param_bytes(engines[0].model.parameters()))

    def on_engine(engine: TrainEngine) -> None:
        engines.append(engine)
        for module in engine.model.modules():
            module.register_forward_hook(track_peak)
        if hasattr(engine, "probe_memory"):
            engine.probe_memory = True
        prof.__enter__()
        hooks.__enter__()

    def on_step(step: int, engine: TrainEngine) -> None:
        stamps.append(time.perf_counter())
        if step == WARMUP:
            hooks.__exit__(None, None, None)
            prof.__exit__(None, None, None)

    ctx = RunContext(
        rank=rank,
        world_size=world,
        device=torch.device("cpu"),
        job_id="bench",
        store=CheckpointStore(str(work / "ckpt"), work / "cache"),
        work_dir=work,
        handle_sigterm=False,
        on_engine=on_engine,
        on_step=on_step,
    )
    Trainer(spec, ctx).run()
    # One dispatcher op (c10d::...) per collective call; gloo's own events would double count.
    calls = Counter(_kind(e.name) for e in prof.events() if e.name.startswith("c10d::"))
    engine = engines[0]
    times = [b - a for a, b in zip(stamps[WARMUP:], stamps[WARMUP + 1 :], strict=False)]
    ckpt_dir = work / "timed"  # shared by the ranks: one DCP / DeepSpeed checkpoint
    torch.distributed.barrier()
    t0 = time.perf_counter()
    engine.save(ckpt_dir)
    torch.distributed.barrier()
    t1 = time.perf_counter()
    engine.load(ckpt_dir)
    torch.distributed.barrier()
    t2 = time.perf_counter()
    mem = engine.memory().as_dict()
    probes = {k: v.as_dict() for k, v in getattr(engine, "probes", {}).items()}
    return {
        "step_s": statistics.median(times) if times else float("nan"),
        "params": mem["params"],
        "grads": probes.get("after_backward", mem)["grads"],
        "optim": mem["optimizer_state"],
        "params_after_forward": probes.get("after_forward", mem)["params"],
        "peak_params_in_forward": peak[0],
        "saved_for_backward": saved.total / WARMUP,
        "all_gathers_per_step": calls["all_gather"] / WARMUP,
        "reduce_scatters_per_step": calls["reduce_scatter"] / WARMUP,
        "all_reduces_per_step": calls["all_reduce"] / WARMUP,
        "reduces_per_step": calls["reduce"] / WARMUP,
        "save_s": t1 - t0,
        "load_s": t2 - t1,
    }


def worker(rank: int, world: int, specs_json: list[str], labels: list[str], shared: str) -> None:
    """`shared` is one directory all ranks see (the timed checkpoint goes there)."""
    rows = []
    for label, spec_json in zip(["warm-up", *labels], [specs_json[0], *specs_json], strict=True):
        work = Path(shared) / label
        if label == "warm-up":  # the first job in a process pays for lazy initialisation
            measure(rank, world, JobSpec.model_validate_json(spec_json), work)
            continue
        rows.append({"label": label, **measure(rank, world, JobSpec.model_validate_json(spec_json), work)})
    if rank == 0:
        (Path(shared) / "rows.json").write_text(json.dumps(rows))


def run(configs: dict[str, JobSpec], nproc: int) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "rows.json"
        spawn_group(
            worker, nproc, [s.model_dump_json() for s in configs.values()], list(configs), tmp, finished=out.is_file
        )
        rows: list[dict[str, Any]] = json.loads(out.read_text())
    return rows


def table(title: str, rows: list[dict[str, Any]], columns: list[str], baseline: str) -> None:
    base = next(r for r in rows if r["label"] == baseline)
    print(f"\n## {title} (ratios to {baseline})")
    print("| config | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")
    for r in rows:
        cells = []
        for c in columns:
            v, b = r[c], base[c]
            ratio = f" ({v / b:.2f}x)" if b else ""
            cells.append(
                f"{v * 1000:.1f} ms{ratio}"
                if c.endswith("_s")
                else f"{v / 1e6:.2f} MB{ratio}"
                if not c.endswith("_per_step")
                else f"{v:.0f}"
            )
        print(f"| {r['label']} | " + " | ".join(cells) + " |")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--sections", default="strategies,wrap,ac", help="comma-separated")
    args = parser.parse_args()
    sections = set(args.sections.split(","))
    print(
        f"# train benchmark: {args.nproc} CPU ranks, preset {args.preset}, {args.steps} steps, "
        f"torch {torch.__version__}"
    )
    print(
        f"command: .venv/bin/python bench/train_strategies.py --nproc {args.nproc} "
        f"--preset {args.preset} --steps {args.steps} --sections {args.sections}"
    )
    spec = lambda **c: make_spec(args.preset, args.steps, num_workers=args.nproc, **c)  # noqa: E731
    if "strategies" in sections:
        strategies = ["ddp", "fsdp-full", "fsdp-grad-op", "fsdp-no-shard", "zero1", "zero2", "zero3"]
        configs = {s: spec(**{"parallel.strategy": s}) for s in strategies}
        # DDP again at the end: its first measured run has been slow (order effect, below).
        configs["ddp-again"] = spec(**{"parallel.strategy": "ddp"})
        rows = run(configs, args.nproc)
        table("strategies", rows, ["step_s", "params", "grads", "optim"], "ddp")
        table(
            "collectives per step",
            rows,
            ["all_gathers_per_step", "reduce_scatters_per_step", "reduces_per_step", "all_reduces_per_step"],
            "ddp",
        )
        table("checkpoint save / restore", rows, ["save_s", "load_s"], "ddp")
    if "wrap" in sections:
        rows = run(
            {
                f"fsdp-full/{w}": spec(**{"parallel.strategy": "fsdp-full", "parallel.wrap": w})
                for w in ("block", "layer", "root")
            },
            args.nproc,
        )
        table(
            "FSDP wrapping granularity",
            rows,
            ["step_s", "all_gathers_per_step", "peak_params_in_forward", "params_after_forward"],
            "fsdp-full/block",
        )
    if "ac" in sections:
        for strategy, modes in (
            ("fsdp-full", ("none", "every-k", "selective", "full")),
            ("fsdp-grad-op", ("none", "full")),
        ):
            rows = run(
                {
                    f"{strategy}/{m}": spec(**{"parallel.strategy": strategy, "parallel.activation_checkpointing": m})
                    for m in modes
                },
                args.nproc,
            )
            table(
                f"activation checkpointing under {strategy}",
                rows,
                ["step_s", "saved_for_backward", "all_gathers_per_step", "peak_params_in_forward"],
                f"{strategy}/none",
            )


if __name__ == "__main__":
    main()
