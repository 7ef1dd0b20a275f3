"""The training loop every launcher runs: local processes, torchrun, or Ray Train workers.

It expects `torch.distributed` to be initialised (or a single process), builds the model,
applies activation checkpointing then the strategy, resumes or starts from `init_from`,
trains, checkpoints every N steps and on a preemption notice, and returns a `TrainResult`.

The host waits for the device only where it must: each step's loss and gradient norm stay
on the device until a metrics line (every `log_every_steps`), a checkpoint or the end of the
run, and the preemption check runs about every `preempt_check_s` seconds (`step_sync`,
`preemption`). A non-finite loss stops the run at the first such sync, before any save.
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
from switchyard.train.memory import peak_memory
from switchyard.train.metrics_log import METRICS_FILE, MetricsRecord, run_output_dir
from switchyard.train.preemption import PreemptionChannel, PreemptionNotice, PreemptionWatcher, SigtermFlag
from switchyard.train.prefetch import DevicePrefetcher
from switchyard.train.profiling import StepProfiler
from switchyard.train.spec import JobSpec, OptimSpec
from switchyard.train.step_metrics import MetricsLine, StepWindow, step_cost
from switchyard.train.step_sync import NonFiniteLossError, PendingSteps, SyncedStep, first_non_finite
from switchyard.train.strategy import Strategy

log = logging.getLogger(__name__)

COMPLETED = "completed"
PREEMPTED = "preempted"
LINE_FIELDS = ("tokens_per_s", "step_time_s", "mfu", "grad_norm", "memory_bytes", "memory_kind")
"""The metrics line fields a `TrainResult` carries."""


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
    tokens_per_s: float | None = None
    """This and the fields down to `memory_kind`: the run's last metrics line."""
    step_time_s: float | None = None
    mfu: float | None = None
    grad_norm: float | None = None
    memory_bytes: int | None = None
    memory_kind: str | None = None
    metrics_file: str | None = None
    """The run's `metrics.jsonl` (on rank 0's host)."""
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
    """Called on every rank with each metrics line (Ray Train's or Tune's `report`)."""
    handle_sigterm: bool = True
    clock: Callable[[], float] = time.monotonic
    """Rank 0's clock for the preemption check interval (tests pass a fake one)."""
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
        self.metrics_dir = run_output_dir(ctx.store.uri, spec.name)
        """Where rank 0 writes `metrics.jsonl` and `tensorboard/`."""
        self.last_line: MetricsLine | None = None
        self._latest: SyncedStep | None = None

    def _barrier(self) -> None:
        if dist.is_initialized():
            dist.barrier()

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
            check_every_s=spec.preempt_check_s,
            first_step=step,
            clock=ctx.clock,
        )
        record = MetricsRecord(self.metrics_dir) if ctx.rank == 0 else None
        try:
            with StepProfiler(ctx.profile_dir, ctx.rank) as profiler:
                return self._train(engine, batches, step, resume, watcher, profiler, record)
        finally:
            sigterm.close()
            if record is not None:
                record.close()

    def _result(
        self, status: str, step: int, checkpoint: str | None, resumed_from: str | None, reason: str | None
    ) -> TrainResult:
        loss = self._latest.loss if self._latest else None
        return TrainResult(
            self.spec.name,
            status,
            step,
            loss,
            checkpoint,
            status == PREEMPTED,
            resumed_from,
            reason,
            losses=self.losses,
            **self._line_fields(),
        )

    def _line_fields(self) -> dict[str, Any]:
        line = self.last_line.as_dict() if self.last_line else {}
        return {**{f: line.get(f) for f in LINE_FIELDS}, "metrics_file": str(self.metrics_dir / METRICS_FILE)}

    def _outcome(self, status: str, resumed_from: str | None, reason: str | None) -> dict[str, Any]:
        """The run's result as checkpoint metrics: under Ray, what the driver gets back."""
        return {
            "job": self.spec.name,
            "status": status,
            "resumable": status == PREEMPTED,
            "resumed_from": resumed_from,
            "reason": reason,
            **self._line_fields(),
        }

    def _sync(self, pending: PendingSteps, checkpoint: str | None) -> SyncedStep | None:
        """The pending steps on the host (collective); stops the run on a non-finite loss."""
        synced = pending.sync()
        bad = first_non_finite(synced)
        if bad is not None:
            error = NonFiniteLossError(bad.step, bad.loss, checkpoint)
            if self.ctx.rank == 0:
                log.error("%s", error)
            raise error
        self.losses.extend(s.loss for s in synced)
        self._latest = synced[-1] if synced else self._latest
        return self._latest

    def _log(
        self,
        step: int,
        lr: float,
        pending: PendingSteps,
        window: StepWindow,
        record: MetricsRecord | None,
        checkpoint: str | None,
    ) -> None:
        latest = self._sync(pending, checkpoint)
        assert latest is not None and latest.step == step, "a log step is synced first"
        memory = peak_memory(self.ctx.device)
        line = window.close(
            time.perf_counter(),  # right after the sync: the device has finished these steps
            step=step,
            loss=latest.loss,
            lr=lr,
            grad_norm=latest.grad_norm,
            memory_bytes=memory.bytes,
            memory_kind=memory.kind,
        )
        self.last_line = line
        if record is not None:
            log.info("%s", line.text())
            record.write(line)
        if self.ctx.report_metrics is not None:
            self.ctx.report_metrics({k: v for k, v in line.as_dict().items() if v is not None})

    def _synced_save(
        self,
        engine: TrainEngine,
        step: int,
        data_state: dict[str, Any],
        reason: str,
        pending: PendingSteps,
        window: StepWindow,
        checkpoint: str | None,
        outcome: dict[str, Any] | None = None,
    ) -> str:
        latest = self._sync(pending, checkpoint)  # raises first: nothing is saved from a non-finite state
        started = time.perf_counter()
        uri = self._save(engine, step, data_state, latest.loss if latest else None, reason, outcome)
        window.exclude(time.perf_counter() - started)  # a save is not step time
        return uri

    def _stop_notice(
        self, step: int, steps_this_run: int, watcher: PreemptionWatcher, force: bool
    ) -> PreemptionNotice | None:
        """A preemption notice, or the step budget: the same answer on every rank."""
        if step >= self.spec.steps:
            return None  # the run is done: its final checkpoint follows
        notice = watcher.check(step, force_read=force) if force or watcher.due(step) else None
        budget = self.ctx.stop_after_steps
        if notice is None and budget is not None and budget <= steps_this_run:
            notice = watcher.stop_requested("stop_after_steps")
        return notice

    def _train(
        self,
        engine: TrainEngine,
        batches: TokenBatches,
        step: int,
        resume: CheckpointRef | None,
        watcher: PreemptionWatcher,
        profiler: StepProfiler,
        record: MetricsRecord | None,
    ) -> TrainResult:
        spec, ctx = self.spec, self.ctx
        feed = DevicePrefetcher(_step_batches(batches, spec.data.grad_accum_steps), ctx.device)
        data_state = batches.state_dict()
        resumed_from = checkpoint = resume.uri if resume else None
        pending = PendingSteps(ctx.world_size)
        window = StepWindow(step_cost(spec, ctx.world_size), time.perf_counter())
        every = spec.checkpoint.every_steps
        steps_this_run = 0
        while step < spec.steps:
            data_state, micro = next(feed)
            lr = lr_at(step, spec.optim, spec.steps)
            with profiler.step(step + 1):
                output = engine.train_step(micro, lr)
            step += 1
            steps_this_run += 1
            pending.add(step, output)
            window.add_step()
            if ctx.on_step is not None:
                ctx.on_step(step, engine)
            if step % spec.log_every_steps == 0 or step == spec.steps:
                self._log(step, lr, pending, window, record, checkpoint)
            checkpoint_due = bool(every) and step % every == 0 and step < spec.steps
            notice = self._stop_notice(step, steps_this_run, watcher, force=checkpoint_due)
            if notice is not None:
                reason = f"preempted: {notice.reason}"
                outcome = self._outcome(PREEMPTED, resumed_from, notice.reason)
                checkpoint = self._synced_save(engine, step, data_state, reason, pending, window, checkpoint, outcome)
                return self._result(PREEMPTED, step, checkpoint, resumed_from, notice.reason)
            if checkpoint_due:
                checkpoint = self._synced_save(engine, step, data_state, "periodic", pending, window, checkpoint)
        if spec.checkpoint.save_final and steps_this_run > 0:
            outcome = self._outcome(COMPLETED, resumed_from, None)
            checkpoint = self._synced_save(engine, step, data_state, "final", pending, window, checkpoint, outcome)
        return self._result(COMPLETED, step, checkpoint, resumed_from, None)
