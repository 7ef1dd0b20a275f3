"""Functions run inside spawned torch.distributed groups by the train tests.

They live in their own module because spawned children import them by name; spawning
costs seconds, so each function runs several jobs in one process group.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import torch

from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.engine import TrainEngine
from switchyard.train.loop import RunContext, Trainer
from switchyard.train.preemption import FilePreemptionChannel
from switchyard.train.spec import JobSpec


def tiny_spec(name: str = "t", **changes: Any) -> JobSpec:
    """A job that trains in well under a second per step on 2 CPU ranks."""
    base = JobSpec.model_validate(
        {
            "name": name,
            "steps": 4,
            "num_workers": 2,
            "model": {"preset": "tiny", "overrides": {"max_seq_len": 32}},
            "data": {"seq_len": 32, "micro_batch_size": 2, "synthetic_bytes": 20_000},
            "optim": {"lr": 3e-3},
            "checkpoint": {"resume": False},
        }
    )
    return base.with_changes(**changes) if changes else base


def job(
    spec: JobSpec, *, store: str | None = None, stop_after: int | None = None, ranks_per_node: int | None = None
) -> dict[str, Any]:
    """One job for `run_jobs`: the spec, its checkpoint store (default: a fresh temp dir), an
    optional `stop_after_steps` and the ranks per (pretend) node."""
    return {"spec": spec.model_dump_json(), "store": store, "stop_after": stop_after, "ranks_per_node": ranks_per_node}


def read_json(path: str | Path) -> Any:
    return json.loads(Path(path).read_text())


def _probe_memory(engine: TrainEngine) -> None:
    if hasattr(engine, "probe_memory"):
        engine.probe_memory = True


def run_jobs(rank: int, world_size: int, jobs: list[dict[str, Any]], out_path: str) -> None:
    """Train each job in turn in this process group; rank 0 writes, per job, the result,
    the loss curve and every rank's bytes (after the first forward, backward and step)."""
    results: list[dict[str, Any]] = []
    for entry in jobs:
        spec = JobSpec.model_validate_json(entry["spec"])
        work = Path(tempfile.mkdtemp(prefix=f"sy-test-{spec.name}-"))
        memory: dict[str, Any] = {}

        def on_step(step: int, engine: TrainEngine, memory: dict[str, Any] = memory) -> None:
            if step == 1:
                memory["after_step"] = engine.memory().as_dict()
                for name, probe in getattr(engine, "probes", {}).items():
                    memory[name] = probe.as_dict()
                memory["peak_grad_bytes"] = getattr(engine, "peak_grad_bytes", None)

        ctx = RunContext(
            rank=rank,
            world_size=world_size,
            device=torch.device("cpu"),
            job_id=spec.name,
            store=CheckpointStore(entry["store"] or str(work / "ckpt"), work / "cache"),
            work_dir=work,
            handle_sigterm=False,
            on_step=on_step,
            on_engine=_probe_memory,
            stop_after_steps=entry["stop_after"],
            ranks_per_node=entry.get("ranks_per_node"),
        )
        result = Trainer(spec, ctx).run()
        gathered: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(gathered, memory)
        # Graphs torch.compile has built in this process so far (a compiled job adds some).
        graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        results.append({**json.loads(result.to_json()), "losses": result.losses, "memory": gathered, "graphs": graphs})
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def preempt_mid_run(rank: int, world_size: int, out_dir: str) -> None:
    """Two 8-step jobs: after step 3, rank 0 posts a notice (job `notice`), then rank 1 alone
    gets SIGTERM (job `sigterm`). Each rank writes its results."""
    out = Path(out_dir)
    channel = FilePreemptionChannel(out / "notices")
    results = {}
    for trigger in ("notice", "sigterm"):

        def on_step(step: int, engine: TrainEngine, trigger: str = trigger) -> None:
            if step == 3 and trigger == "notice" and rank == 0:
                channel.send_notice("notice", "test notice")
            if step == 3 and trigger == "sigterm" and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        ctx = RunContext(
            rank=rank,
            world_size=world_size,
            device=torch.device("cpu"),
            job_id=trigger,
            store=CheckpointStore(str(out / trigger / "ckpt"), out / f"cache{rank}"),
            work_dir=out / f"work{rank}",
            channel=channel,
            on_step=on_step,
        )
        # Checked after every step: the notice arrives during step 3.
        spec = tiny_spec(trigger, steps=8, preempt_check_s=0)
        results[trigger] = json.loads(Trainer(spec, ctx).run().to_json())
    (out / f"rank{rank}.json").write_text(json.dumps(results))


def _first_losses(engine: TrainEngine, spec: JobSpec, rank: int, world_size: int, steps: int = 3) -> list[float]:
    """Train `steps` steps on fixed per-rank batches; every rank's mean loss per step."""
    from switchyard.models import next_token_loss  # noqa: F401  (the engines compute it)

    g = torch.Generator().manual_seed(100 + rank)
    losses = []
    for _ in range(steps):
        x = torch.randint(0, 256, (2, 33), generator=g)
        loss = engine.train_step([(x[:, :-1], x[:, 1:])], 3e-3).loss.detach().clone()
        torch.distributed.all_reduce(loss)
        losses.append(float(loss) / world_size)
    return losses


def construct_on_meta(rank: int, world_size: int, strategies: list[str], out_path: str) -> None:
    """Per strategy: build the engine from a meta model (the trainer's path) and from a
    whole model with the same initialisation; peak live storage bytes while building, and
    the first losses of each."""
    from switchyard.models import GPT
    from switchyard.train.loop import build_engine, build_model
    from switchyard.train.materialize import init_sharded_weights
    from switchyard.train.memory import PeakLiveBytes, param_bytes

    device = torch.device("cpu")
    results: dict[str, Any] = {}
    for strategy in strategies:
        spec = meta_spec(strategy)
        with PeakLiveBytes() as meta_peak:
            built = build_model(spec, device, None)
            # Storage the unwrapped model holds: none on meta, a partition under zero.Init.
            held = param_bytes(p for p in built.parameters() if not p.is_meta)
            engine = build_engine(built, spec, device, world_size)
        meta_losses = _first_losses(engine, spec, rank, world_size)
        del engine
        with PeakLiveBytes() as whole_peak:
            model = GPT(spec.model.gpt_config())
            init_sharded_weights(model, spec.seed)
            engine = build_engine(model, spec, device, world_size)
        whole_losses = _first_losses(engine, spec, rank, world_size)
        del engine, model, built
        peaks: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(peaks, (meta_peak.peak, whole_peak.peak, held))
        results[strategy] = {"meta": meta_losses, "whole": whole_losses, "peaks": peaks}
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def meta_spec(strategy: str) -> JobSpec:
    """Four blocks, so a block is a small part of the model and the bound says something."""
    return tiny_spec(
        f"meta-{strategy}", **{"parallel.strategy": strategy, "model.overrides": {"max_seq_len": 32, "n_layer": 4}}
    )


class CountingChannel(FilePreemptionChannel):
    """A file channel that records after which step each read happened."""

    def __init__(self, directory: Path, step: list[int]) -> None:
        super().__init__(directory)
        self.step = step
        self.reads: list[int] = []

    def poll(self, job_id: str) -> Any:
        self.reads.append(self.step[0])
        return super().poll(job_id)


class LineCollector(logging.Handler):
    """The trainer's metrics log lines (`step N loss ...`) on this rank."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("step "):
            self.lines.append(message)


def metrics_jobs(rank: int, world_size: int, out_dir: str) -> None:
    """Four short jobs sharing one run directory per job across both ranks (so a second
    writer would show): `logged` (a line every 3 steps, no peak), `mfu` (a declared peak),
    `timed` (fake clocks, 1 s per step on rank 0 and 7 s on rank 1, a notice during step 5,
    checks every 3 s) and `ckpt` (checks every 30 s, a checkpoint every 5 steps, SIGTERM to
    rank 1 during step 2). Each rank writes its results, channel reads and log lines."""
    out = Path(out_dir)
    jobs = {
        "logged": tiny_spec("logged", steps=6, log_every_steps=3),
        "mfu": tiny_spec("mfu", steps=2, log_every_steps=1, peak_tflops_per_device=1.0),
        "timed": tiny_spec("timed", steps=12, preempt_check_s=3),
        "ckpt": tiny_spec("ckpt", steps=12, preempt_check_s=30, **{"checkpoint.every_steps": 5}),
    }
    results: dict[str, Any] = {"reads": {}, "logs": {}}
    for name, spec in jobs.items():
        step = [0]
        channel = CountingChannel(out / "notices", step)

        def on_step(
            done: int, engine: TrainEngine, name: str = name, step: list[int] = step, channel: CountingChannel = channel
        ) -> None:
            step[0] = done
            if name == "timed" and done == 5 and rank == 0:
                channel.send_notice(name, "make room")
            if name == "ckpt" and done == 2 and rank == 1:
                os.kill(os.getpid(), signal.SIGTERM)

        collector = LineCollector()
        logging.getLogger("switchyard.train.loop").addHandler(collector)
        ctx = RunContext(
            rank=rank,
            world_size=world_size,
            device=torch.device("cpu"),
            job_id=name,
            store=CheckpointStore(str(out / name), out / f"cache{rank}"),
            work_dir=out / f"work{rank}",
            channel=channel,
            on_step=on_step,
            clock=lambda step=step: float(step[0] * (1 if rank == 0 else 7)),
        )
        result = Trainer(spec, ctx).run()
        logging.getLogger("switchyard.train.loop").removeHandler(collector)
        results[name] = {**json.loads(result.to_json()), "losses": result.losses}
        results["reads"][name] = channel.reads
        results["logs"][name] = collector.lines
    (out / f"rank{rank}.json").write_text(json.dumps(results))


def validation_run(rank: int, world_size: int, spec_json: str, out_dir: str) -> None:
    """Train `spec` (with validation on); then, from the trained weights gathered whole, the
    mean loss over the held-back windows computed by hand on a plain model."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from switchyard.models import GPT, next_token_loss
    from switchyard.train.data import load_tokens, window_count, window_rows
    from switchyard.train.validation import split_windows

    spec = JobSpec.model_validate_json(spec_json)
    out = Path(out_dir)
    engines: list[TrainEngine] = []
    ctx = RunContext(
        rank=rank,
        world_size=world_size,
        device=torch.device("cpu"),
        job_id=spec.name,
        store=CheckpointStore(str(out / "ckpt"), out / f"cache{rank}"),
        work_dir=out / f"work{rank}",
        handle_sigterm=False,
        on_engine=engines.append,
    )
    result = Trainer(spec, ctx).run()
    full = get_model_state_dict(engines[0].model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return
    plain = GPT(spec.model.gpt_config())
    plain.load_state_dict(full)
    plain.eval()
    data = spec.data
    tokens = load_tokens(
        data.source, synthetic_bytes=data.synthetic_bytes, seed=spec.seed, cache_dir=out / "c", vocab_size=None
    )
    held_back = split_windows(window_count(tokens, data.seq_len), spec.validation.sequences, spec.seed).held_back
    x, y = window_rows(tokens, held_back, data.seq_len)
    with torch.no_grad():
        by_hand = next_token_loss(plain(x), y).item()  # the mean over every held-back token
    summary = {**json.loads(result.to_json()), "losses": result.losses, "by_hand": by_hand}
    (out / "result.json").write_text(json.dumps(summary))
