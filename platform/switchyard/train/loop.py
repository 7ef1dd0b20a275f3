"""The training loop every launcher runs: local processes, torchrun, or Ray Train workers.

It expects `torch.distributed` to be initialised (or a single process), builds the model,
applies activation checkpointing, `torch.compile` (optional) and then the strategy, resumes
or starts from `init_from`, trains on batches a background thread prepares
(`batch_thread`), evaluates the held-back split every N steps (`validation`), checkpoints
every N steps and on a preemption notice, and returns a `TrainResult`.

The host waits for the device only where it must: each step's loss and gradient norm stay
on the device until a metrics line (every `log_every_steps`), a checkpoint or the end of the
run, and the preemption check runs about every `preempt_check_s` seconds (`step_sync`,
`preemption`). A non-finite loss stops the run at the first such sync, before any save.

Checkpoints: rank 0 chooses the one to resume from and broadcasts it; each rank reads only
its own part (`switchyard.train.checkpoint`). A periodic save of a DCP engine returns once the
state is staged in host memory; the write, hashing, upload and manifest finish on a commit
thread, their collectives on a gloo group of their own. One save is in flight at a time: the
next save, the final or preemption save (both synchronous) and the end of the run, failed or
not, wait for it first.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import math
import random
import shutil
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar, cast

import torch
import torch.distributed as dist

from switchyard.models import GPT
from switchyard.scheduler.preemption_channel import PreemptionChannel, PreemptionNotice
from switchyard.train.activation import apply_activation_checkpointing
from switchyard.train.batch_thread import BackgroundBatches
from switchyard.train.checkpoint import (
    CheckpointError,
    CheckpointFiles,
    CheckpointRef,
    CheckpointStore,
    FileTable,
    ItemRanges,
    NamedFileLoading,
    Rejection,
    ShardedCheckpointing,
    agreed,
    build_manifest,
    clean_dir,
    file_table,
    gather_file_tables,
    none_valid,
    open_checkpoint,
    step_folder,
)
from switchyard.train.data import TokenBatches, load_tokens
from switchyard.train.engine import Batch, TrainEngine
from switchyard.train.materialize import init_sharded_weights, meta_model
from switchyard.train.memory import peak_memory
from switchyard.train.metrics_log import METRICS_FILE, MetricsRecord, run_output_dir
from switchyard.train.parallelize import compile_blocks
from switchyard.train.preemption import PreemptionWatcher, SigtermFlag
from switchyard.train.prefetch import DevicePrefetcher, map_tensors
from switchyard.train.profiling import StepProfiler
from switchyard.train.spec import JobSpec, OptimSpec
from switchyard.train.step_metrics import MetricsLine, StepWindow, step_cost
from switchyard.train.step_sync import NonFiniteLossError, PendingSteps, SyncedStep, first_non_finite
from switchyard.train.strategy import Strategy
from switchyard.train.validation import HeldBackLoss, training_and_held_back

log = logging.getLogger(__name__)
T = TypeVar("T")

COMPLETED = "completed"
PREEMPTED = "preempted"
LINE_FIELDS = ("tokens_per_s", "step_time_s", "mfu", "grad_norm", "memory_bytes", "memory_kind", "val_loss")
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
    val_loss: float | None = None
    """The last line's validation loss (null unless that line evaluated: the last step does)."""
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
    team: str | None = None
    """The team the job runs for (a platform job): its local metrics directory is the team's."""
    on_step: Callable[[int, TrainEngine], None] | None = None
    profile_dir: Path | None = None
    """Write a torch.profiler trace per rank here and print collective vs compute time."""
    on_engine: Callable[[TrainEngine], None] | None = None
    """Called once the engine is built (tests and benchmarks attach probes here)."""
    on_resume: Callable[[int, str], None] | None = None
    """Called with (step, checkpoint uri) once a checkpoint is restored."""
    ranks_per_node: int | None = None
    """Ranks on this rank's node (Ray Train's local world size); None: every rank on one node.
    Sets fsdp-hybrid's default layout (a shard group per node)."""
    async_save: bool = True
    """Periodic saves return once the state is staged in host memory; the rest of the save
    runs beside training. Only for engines with `ShardedCheckpointing` (DCP) and without a
    `publisher` (Ray Train's `report` must run on the training thread); else synchronous."""


@dataclass
class SaveTiming:
    """One checkpoint save, as the loop saw it (benchmarks and logs)."""

    step: int
    reason: str
    background: bool
    blocked_s: float = 0.0
    """How long the loop waited: the whole save when synchronous, else the wait for the
    previous save plus staging."""
    total_s: float | None = None
    """Until the manifest was stored (set when the save completes)."""


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


def build_model(spec: JobSpec, device: torch.device, base: CheckpointFiles | None) -> GPT:
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


def build_engine(
    model: GPT, spec: JobSpec, device: torch.device, world_size: int, ranks_per_node: int | None = None
) -> TrainEngine:
    """`ranks_per_node` (default: every rank on one node) sets fsdp-hybrid's default layout."""
    # Activation checkpointing, then compile, on the plain model before any wrapping (as
    # torchtitan): see switchyard.train.parallelize for why the order matters with FSDP.
    apply_activation_checkpointing(model, spec.parallel.activation_checkpointing, spec.parallel.checkpoint_every_k)
    if spec.parallel.compile:
        compile_blocks(model)
    bf16 = use_bf16(spec, device)
    if spec.parallel.strategy.is_deepspeed:
        from switchyard.train.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(model, spec, device=device, world_size=world_size, bf16=bf16)
    from switchyard.train.torch_engine import TorchEngine

    return TorchEngine(model, spec, device=device, world_size=world_size, bf16=bf16, ranks_per_node=ranks_per_node)


def load_base_weights(model: GPT, files: CheckpointFiles) -> None:
    """`init_from`: only the model weights of another job's checkpoint, any strategy."""
    if files.ref.format == "deepspeed":
        from switchyard.train.deepspeed_engine import load_deepspeed_weights

        # DeepSpeed's fp32 reconstruction opens every partition: the whole folder, verified.
        load_deepspeed_weights(model, agreed(lambda: files.local_dir(files.names)))
        return
    from switchyard.train.torch_engine import load_dcp_weights

    load_dcp_weights(model, files)


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


StepBatches = tuple[dict[str, Any], list[Batch]]


def step_batches(batches: TokenBatches, accum: int) -> Iterator[StepBatches]:
    # Each step's micro-batches travel with the data position *after* them: the batch thread
    # and the prefetcher read ahead, so the sampler's own position would be steps too far.
    while True:
        micro = [batches.next_batch() for _ in range(accum)]
        yield batches.state_dict(), micro


def pin_on_gpu(device: torch.device) -> Callable[[StepBatches], StepBatches] | None:
    """On a GPU the batch thread pins each batch, so the prefetcher's copy is asynchronous."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    return lambda item: (item[0], map_tensors(item[1], lambda t: t.pin_memory()))


class Trainer:
    """One job on one rank. Construct, then `run()`."""

    def __init__(self, spec: JobSpec, ctx: RunContext) -> None:
        self.spec = spec
        self.ctx = ctx
        self.losses: list[float] = []
        self.metrics_dir = run_output_dir(ctx.store.uri, spec.name, ctx.team)
        """Where rank 0 writes `metrics.jsonl` and `tensorboard/`."""
        self.last_line: MetricsLine | None = None
        self._latest: SyncedStep | None = None
        self.save_timings: list[SaveTiming] = []
        self._background = False
        """Periodic saves run in the background (decided once the engine is built)."""
        self._save_group: Any = None
        """The background saves' own gloo group: their collectives never meet the loop's."""
        self._committer: ThreadPoolExecutor | None = None
        self._in_flight: Future[str] | None = None

    def _barrier(self, group: Any = None) -> None:
        if dist.is_initialized():
            dist.barrier(group=group)

    def _on_rank0(self, work: Callable[[], T]) -> T:
        """`work()` on rank 0 only; every rank gets its result, or raises its failure."""
        if not dist.is_initialized() or dist.get_world_size() == 1:
            return work()
        box: list[Any] = [None]
        failure: Exception | None = None
        if self.ctx.rank == 0:
            try:
                box = [("ok", work())]
            except Exception as exc:  # noqa: BLE001  (re-raised below: the other ranks must not hang)
                failure = exc
                box = [("checkpoint" if isinstance(exc, CheckpointError) else "error", str(exc))]
        dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if failure is not None:
            raise failure
        if kind == "checkpoint":
            raise CheckpointError(value)
        if kind == "error":
            raise RuntimeError(f"rank 0 failed: {value}")
        return cast(T, value)

    def _save(
        self,
        engine: TrainEngine,
        step: int,
        data_state: dict[str, Any],
        loss: float | None,
        reason: str,
        outcome: dict[str, Any] | None = None,
        background: bool = False,
    ) -> str:
        """Checkpoint every rank's state; `outcome` (the run's final status) travels with the
        checkpoint's metrics, which is what Ray Train hands back to the driver. In the
        `background`, this returns once the state is staged; the checkpoint is complete
        (manifest stored) only when `_in_flight` is done."""
        ctx = self.ctx
        started = time.perf_counter()
        background = background and isinstance(engine, ShardedCheckpointing)
        timing = SaveTiming(step, reason, background)
        self.save_timings.append(timing)
        self._await_save()  # one save at a time
        name = step_folder(step)
        rank_dir = clean_dir(ctx.work_dir / "staging" / name / f"rank-{ctx.rank:05d}")
        rank_state = {"step": step, "data": data_state, "rng": _rng_state()}
        torch.save(rank_state, rank_dir / _rank_state_name(ctx.rank))
        fields = {
            "job": self.spec.name,
            "strategy": self.spec.parallel.strategy.value,
            "world_size": ctx.world_size,
            "loss": loss,
            "reason": reason,
        }
        metrics = {"step": step, "loss": loss, "checkpoint_reason": reason, **(outcome or {})}
        if background and isinstance(engine, ShardedCheckpointing):
            written = engine.start_save(rank_dir, self._save_group)
            timing.blocked_s = time.perf_counter() - started
            log.info("checkpoint step %d staged in %.3fs; writing it in the background", step, timing.blocked_s)
            if self._committer is None:
                self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-commit")
            self._in_flight = self._committer.submit(
                self._commit, engine, name, rank_dir, written.result, fields, metrics, timing, started, self._save_group
            )
            return ctx.store.location.child_uri(name)
        items: ItemRanges | None = None
        if isinstance(engine, ShardedCheckpointing):
            items = engine.save_items(rank_dir)
        else:
            engine.save(rank_dir)
        uri = self._commit(engine, name, rank_dir, lambda: items, fields, metrics, timing, started, None)
        timing.blocked_s = time.perf_counter() - started
        return uri

    def _commit(
        self,
        engine: TrainEngine,
        name: str,
        rank_dir: Path,
        written: Callable[[], ItemRanges | None],
        fields: dict[str, Any],
        metrics: dict[str, Any],
        timing: SaveTiming,
        started: float,
        group: Any,
    ) -> str:
        """The rest of a save once the engine's files are written: hash them, publish them,
        then the manifest. On the training thread for a synchronous save; on the commit thread,
        with collectives on `group`, for a background one."""
        ctx = self.ctx
        own = file_table(rank_dir, written())
        files = gather_file_tables(own, group)
        manifest = None
        if ctx.rank == 0:
            manifest = build_manifest(files, step=timing.step, fmt=engine.checkpoint_format, **fields)
        if ctx.publisher is not None:
            uri = ctx.publisher(name, rank_dir, own, manifest, metrics)
            self._barrier(group)  # every rank's files are stored before the manifest names them
            if manifest is not None:
                ctx.store.put_manifest(name, rank_dir, manifest)
            self._barrier(group)
            ctx.publisher.published()
        else:
            ctx.store.publish(name, rank_dir, own, manifest, lambda: self._barrier(group))
            uri = ctx.store.location.child_uri(name)
            if ctx.rank == 0 and ctx.prune:
                ctx.store.prune(self.spec.checkpoint.keep)
        shutil.rmtree(rank_dir)
        # Ranks sharing a work dir share the step folder: the last one out removes it.
        with contextlib.suppress(OSError):
            rank_dir.parent.rmdir()
        self._barrier(group)
        timing.total_s = time.perf_counter() - started
        log.info("checkpoint step %d saved to %s in %.2fs (%s)", timing.step, uri, timing.total_s, timing.reason)
        return uri

    def _await_save(self) -> None:
        """Wait until the background save in flight, if any, is complete (its failure is
        raised here)."""
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is not None:
            in_flight.result()

    def _close_saves(self, failing: bool) -> None:
        """End of the run, on every path: the save in flight completes first (its checkpoint
        was taken before any failure: saves follow a checked sync), then its thread and group go."""
        try:
            self._await_save()
        except Exception:
            if not failing:
                raise
            log.exception("the background checkpoint failed too")
        finally:
            if self._committer is not None:
                self._committer.shutdown()
                self._committer = None
            if self._save_group is not None:
                dist.destroy_process_group(self._save_group)
                self._save_group = None

    def _start_background_saves(self, engine: TrainEngine) -> None:
        ctx = self.ctx
        self._background = (
            ctx.async_save
            and ctx.publisher is None
            and isinstance(engine, ShardedCheckpointing)
            and self.spec.checkpoint.every_steps > 0  # only periodic saves run in the background
        )
        if self._background and dist.is_initialized():
            # DCP's async save needs a group that handles CPU tensors, and its collectives run
            # beside the loop's: a group of their own, so the two streams never interleave.
            self._save_group = dist.new_group(backend="gloo")

    def _restore(self, engine: TrainEngine, ref: CheckpointRef) -> tuple[int, dict[str, Any]]:
        """Load `ref` into the engine reading only this rank's part; a `CheckpointError` is
        raised on every rank alike."""
        ctx = self.ctx
        files = CheckpointFiles(ref, ctx.store.cache_dir)
        own = _rank_state_name(ctx.rank)
        saved_world = ref.world_size or ctx.world_size
        same_ranks = saved_world == ctx.world_size and own in ref.manifest["files"]
        raw = agreed(lambda: files.read(own if same_ranks else _rank_state_name(0)))
        if isinstance(engine, ShardedCheckpointing) and ref.format == "dcp":
            engine.load_items(files)
        else:
            wanted = engine.checkpoint_files(files.names) if isinstance(engine, NamedFileLoading) else files.names
            engine.load(agreed(lambda: files.local_dir(wanted)))
        state = torch.load(io.BytesIO(raw), weights_only=True)
        if not same_ranks:
            # Weights and optimizer reshard through DCP, but per-rank RNG streams cannot:
            # keep the data position (it is global) and reseed.
            log.warning(
                "resuming %s saved by %d ranks on %d: RNG streams are reseeded", ref.uri, saved_world, ctx.world_size
            )
            torch.manual_seed(self.spec.seed + 7919 * (ctx.rank + 1) + int(state["step"]))
        else:
            _set_rng_state(state["rng"])
        return int(state["step"]), dict(state["data"])

    def _resume(
        self, engine: TrainEngine, ref: CheckpointRef, judged: list[Rejection]
    ) -> tuple[CheckpointRef, int, dict[str, Any]]:
        """Restore the newest checkpoint every rank can read; one that fails on any rank is
        skipped, the problem named, and rank 0 chooses again."""
        current: CheckpointRef | None = ref
        while current is not None:
            try:
                step, data_state = self._restore(engine, current)
                return current, step, data_state
            except CheckpointError as exc:  # raised on every rank alike
                if self.ctx.rank == 0:
                    log.warning("checkpoint %s skipped: %s", current.uri, exc)
                judged.append((current.name, str(exc)))
            current, rejected = self._on_rank0(partial(self.ctx.store.newest_complete, {n for n, _ in judged}))
            judged += rejected
        raise none_valid(self.ctx.store.uri, judged)

    def run(self) -> TrainResult:
        spec, ctx = self.spec, self.ctx
        # Rank 0 alone reads manifests and listings; every rank gets its choice.
        choice, judged = self._on_rank0(ctx.store.newest_complete) if spec.checkpoint.resume else (None, [])
        if choice is None and judged:
            raise none_valid(ctx.store.uri, judged)
        base = None
        if spec.init_from and choice is None:
            init_from = spec.init_from
            ref = self._on_rank0(lambda: open_checkpoint(init_from, ctx.work_dir / "init_from"))
            base = CheckpointFiles(ref, ctx.work_dir / "init_from")
            log.info("initialising weights from %s (step %d)", ref.uri, ref.step)
        # Initial weights depend on the seed and each parameter's name only: the same on
        # every rank, strategy and sharding (switchyard.train.materialize).
        engine = build_engine(build_model(spec, ctx.device, base), spec, ctx.device, ctx.world_size, ctx.ranks_per_node)
        if ctx.on_engine is not None:
            ctx.on_engine(engine)
        torch.manual_seed(spec.seed + 7919 * (ctx.rank + 1))  # per-rank dropout streams
        tokens = load_tokens(
            spec.data.source,
            synthetic_bytes=spec.data.synthetic_bytes,
            seed=spec.seed,
            cache_dir=ctx.work_dir / "cache",
            vocab_size=spec.model.gpt_config().vocab_size,
        )
        batches, validation = training_and_held_back(tokens, spec, ctx.rank, ctx.world_size, ctx.device)
        step = 0
        resume = None
        if choice is not None:
            resume, step, data_state = self._resume(engine, choice, judged)
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
        self._start_background_saves(engine)
        try:
            with StepProfiler(ctx.profile_dir, ctx.rank) as profiler:
                result = self._train(engine, batches, validation, step, resume, watcher, profiler, record)
        except BaseException:
            self._close_saves(failing=True)
            raise
        finally:
            sigterm.close()
            if record is not None:
                record.close()
        self._close_saves(failing=False)
        return result

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
        engine: TrainEngine,
        validation: HeldBackLoss | None,
    ) -> None:
        """A metrics line; with `validation`, its loss too (timed out of the step window)."""
        latest = self._sync(pending, checkpoint)
        assert latest is not None and latest.step == step, "a log step is synced first"
        val_loss = None
        if validation is not None:
            started = time.perf_counter()  # after the sync: the device has finished training
            val_loss = validation.mean(engine)
            window.exclude(time.perf_counter() - started)
        memory = peak_memory(self.ctx.device)
        line = window.close(
            time.perf_counter(),  # right after the sync: the device has finished these steps
            step=step,
            loss=latest.loss,
            lr=lr,
            grad_norm=latest.grad_norm,
            memory_bytes=memory.bytes,
            memory_kind=memory.kind,
            val_loss=val_loss,
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
        background: bool = False,
    ) -> str:
        latest = self._sync(pending, checkpoint)  # raises first: nothing is saved from a non-finite state
        started = time.perf_counter()
        uri = self._save(engine, step, data_state, latest.loss if latest else None, reason, outcome, background)
        window.exclude(time.perf_counter() - started)  # the loop's wait for a save is not step time
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
        validation: HeldBackLoss | None,
        step: int,
        resume: CheckpointRef | None,
        watcher: PreemptionWatcher,
        profiler: StepProfiler,
        record: MetricsRecord | None,
    ) -> TrainResult:
        data_state = batches.state_dict()  # before the batch thread starts reading ahead
        source = step_batches(batches, self.spec.data.grad_accum_steps)
        with BackgroundBatches(source, depth=2, prepare=pin_on_gpu(self.ctx.device)) as prepared:
            feed = DevicePrefetcher(prepared, self.ctx.device)
            return self._steps(engine, feed, data_state, validation, step, resume, watcher, profiler, record)

    def _steps(
        self,
        engine: TrainEngine,
        feed: Iterator[StepBatches],
        data_state: dict[str, Any],
        validation: HeldBackLoss | None,
        step: int,
        resume: CheckpointRef | None,
        watcher: PreemptionWatcher,
        profiler: StepProfiler,
        record: MetricsRecord | None,
    ) -> TrainResult:
        spec, ctx = self.spec, self.ctx
        resumed_from = checkpoint = resume.uri if resume else None
        pending = PendingSteps(ctx.world_size)
        window = StepWindow(step_cost(spec, ctx.world_size), time.perf_counter())
        every = spec.checkpoint.every_steps
        eval_every = spec.validation.every_steps
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
            eval_due = validation is not None and (step % eval_every == 0 or step == spec.steps)
            if eval_due or step % spec.log_every_steps == 0 or step == spec.steps:
                self._log(step, lr, pending, window, record, checkpoint, engine, validation if eval_due else None)
            checkpoint_due = bool(every) and step % every == 0 and step < spec.steps
            notice = self._stop_notice(step, steps_this_run, watcher, force=checkpoint_due)
            if notice is not None:
                reason = f"preempted: {notice.reason}"
                outcome = self._outcome(PREEMPTED, resumed_from, notice.reason)
                checkpoint = self._synced_save(engine, step, data_state, reason, pending, window, checkpoint, outcome)
                return self._result(PREEMPTED, step, checkpoint, resumed_from, notice.reason)
            if checkpoint_due:
                checkpoint = self._synced_save(
                    engine, step, data_state, "periodic", pending, window, checkpoint, background=self._background
                )
        if spec.checkpoint.save_final and steps_this_run > 0:
            outcome = self._outcome(COMPLETED, resumed_from, None)
            checkpoint = self._synced_save(engine, step, data_state, "final", pending, window, checkpoint, outcome)
        return self._result(COMPLETED, step, checkpoint, resumed_from, None)
