"""How long a periodic checkpoint save blocks the training loop: synchronous vs background.

    .venv/bin/python bench/train_checkpoint.py [--nproc 2] [--preset small] [--steps 16] [--every 4]

The same job (fsdp-full, gloo CPU ranks, a local store) runs twice in one process group, after
a throw-away warm-up job: once with `RunContext(async_save=False)` and once with background
periodic saves (DCP `async_save`). Per periodic save, rank 0 records how long the loop waited
(synchronous: the whole save — DCP write, sha256 of every item, copy into the store, manifest,
barriers; background: staging into host memory, plus any wait for the previous save) and how
long until the manifest was stored. Step time: the median of the steps that neither held a
save nor ran while a background write was in flight. "Run slowed per save": the extra wall
time of the steps a save touched (the one it blocked, and those that ran beside its write)
over as many median steps: on a machine without idle cores the background write still
takes its CPU time from training.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "platform"), str(ROOT)]

from switchyard.train.checkpoint import CheckpointStore  # noqa: E402
from switchyard.train.engine import TrainEngine  # noqa: E402
from switchyard.train.launch import spawn_group  # noqa: E402
from switchyard.train.loop import RunContext, Trainer  # noqa: E402
from switchyard.train.spec import JobSpec  # noqa: E402


def make_spec(preset: str, steps: int, every: int, strategy: str) -> JobSpec:
    return JobSpec.model_validate(
        {
            "name": "bench-ckpt",
            "steps": steps,
            "model": {"preset": preset},
            "data": {"seq_len": 128, "micro_batch_size": 4, "synthetic_bytes": 400_000},
            "optim": {"warmup_steps": 2},
            "parallel": {"strategy": strategy},
            "checkpoint": {"resume": False, "save_final": False, "every_steps": every},
        }
    )


def measure(rank: int, world: int, spec: JobSpec, async_save: bool, work: Path) -> dict[str, Any]:
    stamps = [time.perf_counter()]

    def on_step(step: int, engine: TrainEngine) -> None:
        stamps.append(time.perf_counter())

    ctx = RunContext(
        rank=rank,
        world_size=world,
        device=torch.device("cpu"),
        job_id=spec.name,
        store=CheckpointStore(str(work / "ckpt"), work / "cache"),
        work_dir=work / f"work{rank}",
        handle_sigterm=False,
        on_step=on_step,
        async_save=async_save,
    )
    trainer = Trainer(spec, ctx)
    trainer.run()
    # A step's time runs from the end of the previous one: a save after step k lands in step
    # k+1; a background write may go on over the steps after that.
    step_s = [b - a for a, b in itertools.pairwise(stamps)]
    saves = [t for t in trainer.save_timings if t.reason == "periodic"]
    touched: dict[int, set[int]] = {}
    for t in saves:
        assert t.total_s is not None
        write_end = stamps[t.step] + t.total_s
        touched[t.step] = {t.step + 1} | {k for k in range(t.step + 2, len(stamps)) if stamps[k - 1] < write_end}
    held = set().union(*touched.values()) if touched else set()
    plain = statistics.median(s for k, s in enumerate(step_s, 1) if k not in held and k > 2)
    return {
        "step_s": plain,
        "blocked_s": [t.blocked_s for t in saves],
        "total_s": [t.total_s for t in saves],
        # What the save cost the run in wall-clock time: the steps it touched, less as many plain steps.
        "cost_s": [sum(step_s[k - 1] - plain for k in touched[t.step]) for t in saves],
    }


def run_modes(rank: int, world: int, spec_json: str, out_path: str) -> None:
    spec = JobSpec.model_validate_json(spec_json)
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        warmup = spec.with_changes(steps=spec.checkpoint.every_steps + 1)
        measure(rank, world, warmup, True, root / "warmup")
        for mode, async_save in (("sync", False), ("background", True)):
            results[mode] = measure(rank, world, spec, async_save, root / mode)
            torch.distributed.barrier()
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.0f} ms"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--preset", default="small")
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--every", type=int, default=4)
    parser.add_argument("--strategy", default="fsdp-full")
    args = parser.parse_args()
    spec = make_spec(args.preset, args.steps, args.every, args.strategy)
    params = spec.model.gpt_config().num_parameters()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        spawn_group(run_modes, args.nproc, spec.model_dump_json(), str(out), finished=out.is_file)
        results = json.loads(out.read_text())
    print(
        f"{args.strategy}, {args.preset} ({params / 1e6:.1f}M parameters, model + AdamW state "
        f"≈ {params * 12 / 1e6:.0f} MB over {args.nproc} ranks), {args.steps} steps, a save every {args.every}"
    )
    print(f"command: .venv/bin/python {' '.join(sys.argv)}\n")
    columns = ["periodic save", "step time", "loop blocked per save (median, max)", "blocked / step"]
    columns += ["until manifest stored", "run slowed per save"]
    print("| " + " | ".join(columns) + " |")
    print("|---" * len(columns) + "|")
    for mode in ("sync", "background"):
        r = results[mode]
        blocked = r["blocked_s"]
        print(
            f"| {mode} | {ms(r['step_s'])} | {ms(statistics.median(blocked))}, {ms(max(blocked))} | "
            f"{statistics.median(blocked) / r['step_s']:.2f} | {ms(statistics.median(r['total_s']))} | "
            f"{ms(statistics.median(r['cost_s']))} |"
        )


if __name__ == "__main__":
    main()
