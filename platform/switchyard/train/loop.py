"""The training loop every launcher runs: local processes, torchrun, or Ray Train workers.

It expects `torch.distributed` to be initialised (or a single process), builds the model,
applies activation checkpointing then the strategy, resumes or starts from `init_from`,
trains, checkpoints every N steps and on a preemption notice, and returns a `TrainResult`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import Tensor

from switchyard.models import GPT
from switchyard.train.activation import apply_activation_checkpointing
from switchyard.train.checkpoint import (
    CheckpointRef,
    CheckpointStore,
    FileTable,
    build_manifest,
    clean_dir,
    file_table,
    gather_file_tables,
    open_checkpoint,
    step_folder,
)
from switchyard.train.data import TokenBatches, load_tokens
from switchyard.train.engine import Batch, TrainEngine
from switchyard.train.materialize import init_sharded_weights, meta_model
from switchyard.train.preemption import PreemptionChannel, PreemptionWatcher, SigtermFlag
from switchyard.train.prefetch import DevicePrefetcher
from switchyard.train.profiling import StepProfiler
from switchyard.train.spec import JobSpec, OptimSpec
from switchyard.train.strategy import Strategy

log = logging.getLogger(__name__)

COMPLETED = "completed"
PREEMPTED = "preempted"


@dataclass
class TrainResult:
    """What a run ends with; `to_json()` is the one line `train_jobs.run` prints."""

    job: str
    status: str
    step: int
    loss: float | None
    checkpoint: str | None
    resumable: bool
    resumed_from: str | None = None
    reason: str | None = None
    losses: list[float] = field(default_factory=list)

    def to_json(self) -> str:
        data = asdict(self)
        data.pop("losses")
        return json.dumps(data, sort_keys=True)


class CheckpointPublisher(Protocol):
    """Moves one rank's saved files out of its staging dir (not the manifest: the trainer
    writes that once every rank's files are stored); returns the checkpoint URI."""

    def __call__(
        self,
        name: str,
        rank_dir: Path,
        own: FileTable,
        manifest: dict[str, Any] | None,
        metrics: dict[str, Any],
    ) -> str: ...

    def published(self) -> None:
        """The manifest is stored: the checkpoint is complete."""
        ...


@dataclass
class RunContext:
    """Where the loop runs and where its outputs go (filled in by a launcher)."""

    rank: int
    world_size: int
    device: torch.device
    job_id: str
    store: CheckpointStore
    work_dir: Path
    """Rank-local scratch: staging for checkpoint files, caches."""
    channel: PreemptionChannel | None = None
    publisher: CheckpointPublisher | None = None
    """None: publish into `store` (local or s3). Ray Train sets one that reports to Ray."""
    report_metrics: Callable[[dict[str, Any]], None] | None = None
    handle_sigterm: bool = True
    min_poll_interval_s: float = 0.0
    prune: bool = True
    stop_after_steps: int | None = None
    """Stop (as preempted) after this many steps of *this* run: for tests and sweeps."""
    on_step: Callable[[int, TrainEngine], None] | None = None
    profile_dir: Path | None = None
    """Write a torch.profiler trace per rank here and print collective vs compute time."""
    on_engine: Callable[[TrainEngine], None] | None = None
    """Called once the engine is built (tests and benchmarks attach probes here)."""
    on_resume: Callable[[int, str], None] | None = None
    """Called with (step, checkpoint uri) once a checkpoint is restored."""


def lr_at(step: int, optim: OptimSpec, total_steps: int) -> float:
    """Linear warmup, then cosine decay to 10% of the peak at `total_steps`. A function of
    the step alone, so the schedule's checkpoint state is the step counter."""
    if step < optim.warmup_steps:
        return optim.lr * (step + 1) / optim.warmup_steps
    span = max(1, total_steps - optim.warmup_steps)
    progress = min(1.0, (step - optim.warmup_steps) / span)
    return optim.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def use_bf16(spec: JobSpec, device: torch.device) -> bool:
    if spec.parallel.precision == "auto":
        return bool(device.type == "cuda")
    return bool(spec.parallel.precision == "bf16")


def build_model(spec: JobSpec, device: torch.device, base: CheckpointRef | None) -> GPT:
    """The model before any wrapping: on the meta device (ZeRO-3: partitioned by
    `zero.Init`), so no rank materialises it whole; the engine gives it storage after
    sharding. Only `init_from` builds it whole, to load another job's weights into it."""
    config = spec.model.gpt_config()
    if base is not None:
        model = GPT(config)
        init_sharded_weights(model, spec.seed)
        load_base_weights(model, base)
        return model
    if spec.parallel.strategy is Strategy.ZERO3:
        from switchyard.train.deepspeed_engine import partitioned_model

        return partitioned_model(config, spec, bf16=use_bf16(spec, device))
    return meta_model(config)


def build_engine(model: GPT, spec: JobSpec, device: torch.device, world_size: int) -> TrainEngine:
    # Activation checkpointing goes on the plain model before any wrapping: see
    # switchyard.train.parallelize for why the order matters with FSDP.
    apply_activation_checkpointing(model, spec.parallel.activation_checkpointing, spec.parallel.checkpoint_every_k)
    bf16 = use_bf16(spec, device)
    if spec.parallel.strategy.is_deepspeed:
        from switchyard.train.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(model, spec, device=device, world_size=world_size, bf16=bf16)
    from switchyard.train.torch_engine import TorchEngine

    return TorchEngine(model, spec, device=device, world_size=world_size, bf16=bf16)


def load_base_weights(model: GPT, ref: CheckpointRef) -> None:
    """`init_from`: only the model weights of another job's checkpoint, any strategy."""
    if ref.format == "deepspeed":
        from switchyard.train.deepspeed_engine import load_deepspeed_weights

        load_deepspeed_weights(model, ref.local_dir)
        return
    state = {"model": model.state_dict()}
    # A plain model's state dict has the same names as FSDP's / DDP's full state dict, and
    # DCP reads (and reshards) just the keys asked for: the optimizer state stays on disk.
    dcp.load(state, checkpoint_id=ref.local_dir)
    model.load_state_dict(state["model"])


def _rank_state_name(rank: int) -> str:
    return f"train-state-rank-{rank:05d}.pt"


def _rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _step_batches(batches: TokenBatches, accum: int) -> Iterator[tuple[dict[str, Any], list[Batch]]]:
    # Each step's micro-batches travel with the data position *after* them: the prefetcher
    # reads one step ahead, so the sampler's own position would be one step too far.
    while True:
        micro = [batches.next_batch() for _ in range(accum)]
        yield batches.state_dict(), micro


class Trainer:
    """One job on one rank. Construct, then `run()`."""

    def __init__(self, spec: JobSpec, ctx: RunContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.losses: list[float] = []

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

    def _mean_over_ranks(self, loss: Tensor) -> float:
        loss = loss.detach().float().clone()
        if dist.is_initialized():
            dist.all_reduce(loss)  # SUM: gloo has no AVG
            loss /= self.ctx.world_size
        return float(loss.item())

    def _save(
        self,
        engine: TrainEngine,
        step: int,
        data_state: dict[str, Any],
        loss: float | None,
        reason: str,
        outcome: dict[str, Any] | None = None,
    ) -> str:
        """Checkpoint every rank's state; `outcome` (the run's final status) travels with the
        checkpoint's metrics, which is what Ray Train hands back to the driver."""
        ctx = self.ctx
        name = step_folder(step)
        started = time.perf_counter()
        rank_dir = clean_dir(ctx.work_dir / "staging" / name / f"rank-{ctx.rank:05d}")
        engine.save(rank_dir)
        rank_state = {"step": step, "data": data_state, "rng": _rng_state()}
        torch.save(rank_state, rank_dir / _rank_state_name(ctx.rank))
        own = file_table(rank_dir)
        files = gather_file_tables(own)
        manifest = None
        if ctx.rank == 0:
            manifest = build_manifest(
                files,
                step=step,
                fmt=engine.checkpoint_format,
                job=self.spec.name,
                strategy=self.spec.parallel.strategy.value,
                world_size=ctx.world_size,
                loss=loss,
                reason=reason,
            )
        metrics = {"step": step, "loss": loss, "checkpoint_reason": reason, **(outcome or {})}
        if ctx.publisher is not None:
            uri = ctx.publisher(name, rank_dir, own, manifest, metrics)
            self._barrier()  # every rank's files are stored before the manifest names them
            if manifest is not None:
                ctx.store.put_manifest(name, rank_dir, manifest)
            self._barrier()
            ctx.publisher.published()
        else:
            ctx.store.publish(name, rank_dir, own, manifest, self._barrier)
            uri = ctx.store.location.child_uri(name)
            if ctx.rank == 0 and ctx.prune:
                ctx.store.prune(self.spec.checkpoint.keep)
        shutil.rmtree(rank_dir)
        # Ranks sharing a work dir share the step folder: the last one out removes it.
        with contextlib.suppress(OSError):
            rank_dir.parent.rmdir()
        self._barrier()
        log.info("checkpoint step %d saved to %s in %.2fs (%s)", step, uri, time.perf_counter() - started, reason)
        return uri

    def _restore(self, engine: TrainEngine, ref: CheckpointRef) -> tuple[int, dict[str, Any]]:
        engine.load(ref.local_dir)
        own = ref.local_dir / _rank_state_name(self.ctx.rank)
        saved_world = int(ref.manifest.get("world_size", self.ctx.world_size))
        if saved_world != self.ctx.world_size or not own.is_file():
            # Weights and optimizer reshard through DCP, but per-rank RNG streams cannot:
            # keep the data position (it is global) and reseed.
            log.warning(
                "resuming %s saved by %d ranks on %d: RNG streams are reseeded",
                ref.uri,
                saved_world,
                self.ctx.world_size,
            )
            state = torch.load(ref.local_dir / _rank_state_name(0), weights_only=True)
            torch.manual_seed(self.spec.seed + 7919 * (self.ctx.rank + 1) + int(state["step"]))
        else:
            state = torch.load(own, weights_only=True)
            _set_rng_state(state["rng"])
        return int(state["step"]), dict(state["data"])

    def run(self) -> TrainResult:
        spec, ctx = self.spec, self.ctx
        resume = ctx.store.latest_valid() if spec.checkpoint.resume else None
        base = None
        if spec.init_from and resume is None:
            base = open_checkpoint(spec.init_from, ctx.work_dir / "init_from")
            log.info("initialising weights from %s (step %d)", base.uri, base.step)
        # Initial weights depend on the seed and each parameter's name only: the same on
        # every rank, strategy and sharding (switchyard.train.materialize).
        engine = build_engine(build_model(spec, ctx.device, base), spec, ctx.device, ctx.world_size)
        if ctx.on_engine is not None:
            ctx.on_engine(engine)
        torch.manual_seed(spec.seed + 7919 * (ctx.rank + 1))  # per-rank dropout streams
        tokens = load_tokens(
            spec.data.source,
            synthetic_bytes=spec.data.synthetic_bytes,
            seed=spec.seed,
            cache_dir=ctx.work_dir / "cache",
        )
        batches = TokenBatches(
            tokens, spec.data.seq_len, spec.data.micro_batch_size, ctx.rank, ctx.world_size, spec.seed
        )
        step = 0
        if resume is not None:
            step, data_state = self._restore(engine, resume)
            batches.load_state_dict(data_state)
            log.info("resumed from %s at step %d", resume.uri, step)
            if ctx.on_resume is not None:
                ctx.on_resume(step, resume.uri)
        sigterm = SigtermFlag()
        if ctx.handle_sigterm:
            sigterm.install()
        watcher = PreemptionWatcher(
            ctx.channel,
            ctx.job_id,
            rank=ctx.rank,
            device=ctx.device,
            sigterm=sigterm,
            min_poll_interval_s=ctx.min_poll_interval_s,
        )
        try:
            with StepProfiler(ctx.profile_dir, ctx.rank) as profiler:
                return self._train(engine, batches, step, resume, watcher, profiler)
        finally:
            sigterm.close()

    def _outcome(self, status: str, resumable: bool, resumed_from: str | None, reason: str | None) -> dict[str, Any]:
        return {
            "job": self.spec.name,
            "status": status,
            "resumable": resumable,
            "resumed_from": resumed_from,
            "reason": reason,
        }

    def _train(
        self,
        engine: TrainEngine,
        batches: TokenBatches,
        step: int,
        resume: CheckpointRef | None,
        watcher: PreemptionWatcher,
        profiler: StepProfiler,
    ) -> TrainResult:
        spec, ctx = self.spec, self.ctx
        feed = DevicePrefetcher(_step_batches(batches, spec.data.grad_accum_steps), ctx.device)
        data_state, loss, checkpoint = batches.state_dict(), None, None
        resumed_from = resume.uri if resume else None
        if resume is not None:
            checkpoint = resume.uri
        steps_this_run = 0
        while step < spec.steps:
            data_state, micro = next(feed)
            with profiler.step(step + 1):
                step_loss = engine.train_step(micro, lr_at(step, spec.optim, spec.steps))
            loss = self._mean_over_ranks(step_loss)
            step += 1
            steps_this_run += 1
            self.losses.append(loss)
            if ctx.on_step is not None:
                ctx.on_step(step, engine)
            if ctx.report_metrics is not None and step % spec.log_every == 0:
                ctx.report_metrics({"step": step, "loss": loss})
            if step % spec.log_every == 0 and ctx.rank == 0:
                log.info("step %d loss %.4f", step, loss)
            notice = watcher.check()
            budget = ctx.stop_after_steps
            if notice is None and budget is not None and budget <= steps_this_run < spec.steps:
                notice = watcher.stop_requested("stop_after_steps")
            if notice is not None:
                outcome = self._outcome(PREEMPTED, True, resumed_from, notice.reason)
                checkpoint = self._save(engine, step, data_state, loss, f"preempted: {notice.reason}", outcome)
                return TrainResult(
                    spec.name, PREEMPTED, step, loss, checkpoint, True, resumed_from, notice.reason, self.losses
                )
            every = spec.checkpoint.every_steps
            if every and step % every == 0 and step < spec.steps:
                checkpoint = self._save(engine, step, data_state, loss, "periodic")
        if spec.checkpoint.save_final and steps_this_run > 0:
            outcome = self._outcome(COMPLETED, False, resumed_from, None)
            checkpoint = self._save(engine, step, data_state, loss, "final", outcome)
        return TrainResult(spec.name, COMPLETED, step, loss, checkpoint, False, resumed_from, None, self.losses)
