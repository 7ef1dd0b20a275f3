"""The Ray Train adapter: the same `Trainer` loop inside `TorchTrainer` workers.

Checkpoints are reported with `ray.train.report(..., checkpoint=...)`: each worker reports
its own staging directory and Ray merges them into `<storage>/<job name>/step-N/`, the same
layout `CheckpointStore` reads, so resume (re-running `fit()` with the same name and
storage) and corrupt-checkpoint skipping work as in local runs.
"""

from __future__ import annotations

import logging
import signal
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import ray.train
import torch
from ray.train import Checkpoint, CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer, get_device

from switchyard.cluster.preemption_channel import GcsPreemptionChannel
from switchyard.state import state_dir
from switchyard.train.checkpoint import CheckpointStore, FileTable
from switchyard.train.job_errors import INPUT_ERROR_KEY, JobInputError, raise_input_error
from switchyard.train.launch import process_group_backend, team_storage
from switchyard.train.loop import LINE_FIELDS, RunContext, Trainer, TrainResult
from switchyard.train.run_gauges import RunGauges
from switchyard.train.spec import JobSpec
from switchyard.train.step_sync import NonFiniteLossError

log = logging.getLogger(__name__)


class RayReportPublisher:
    """Publishes a checkpoint by reporting every rank's directory to Ray Train."""

    def __init__(self, run_uri: str, rank: int, on_published: Callable[[], None] | None = None) -> None:
        self.run_uri = run_uri.rstrip("/")
        self.rank = rank
        self.on_published = on_published  # e.g. tell the scheduler how fresh the checkpoint is

    def __call__(
        self,
        name: str,
        rank_dir: Path,
        own: FileTable,
        manifest: dict[str, Any] | None,
        metrics: dict[str, Any],
    ) -> str:
        # Each rank's part is uploaded on its own (file by file, concurrently, on S3): the
        # manifest may not travel with them, or a node lost mid-upload leaves a manifest that
        # names files that never arrived. `report` returns once this rank's files are stored;
        # after every rank's have, rank 0 writes the manifest itself (`publish_manifest`).
        uri = f"{self.run_uri}/{name}"
        ray.train.report(
            {**metrics, "checkpoint": uri},
            checkpoint=Checkpoint.from_directory(str(rank_dir)),
            checkpoint_dir_name=name,
        )
        return uri

    def published(self) -> None:
        """The manifest is stored: the checkpoint is complete (tell whoever waits for it)."""
        if self.on_published is not None and self.rank == 0:
            self.on_published()


def train_fn(config: dict[str, Any]) -> dict[str, Any] | None:
    """The per-worker function `TorchTrainer` runs; returns `{"non_finite_loss": ...}` when
    the loss became non-finite, `{"job_input_error": ...}` when its data or checkpoints cannot
    be used (rank 0's return value is `fit()`'s `return_value`)."""
    spec = JobSpec.model_validate(config["spec"])
    context = ray.train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    work_dir = Path(tempfile.mkdtemp(prefix=f"switchyard-{spec.name}-r{rank}-"))
    run_uri = config["run_uri"]
    workload_id = config.get("workload_id")
    on_published = _scheduler_reporter(workload_id) if workload_id else None
    ctx = RunContext(
        rank=rank,
        world_size=world_size,
        # Logical GPUs (a leased GPU on a machine without one) train on the CPU.
        device=get_device() if torch.cuda.is_available() else torch.device("cpu"),
        job_id=config["job_id"],
        store=CheckpointStore(run_uri, work_dir / "checkpoints"),
        work_dir=work_dir,
        channel=GcsPreemptionChannel(),
        publisher=RayReportPublisher(run_uri, rank, on_published),
        report_metrics=_reporter(spec.name, workload_id, rank),
        prune=False,  # CheckpointConfig(num_to_keep) prunes under Ray
        stop_after_steps=config.get("stop_after_steps"),
        team=config.get("team"),
        ranks_per_node=context.get_local_world_size(),
        on_resume=_resume_reporter(workload_id) if workload_id and rank == 0 else None,
    )
    try:
        result = Trainer(spec, ctx).run()
    except NonFiniteLossError as exc:
        # Every rank stops at the same step (the loss is all-reduced before the check). Return
        # it rather than raise: a raised error reaches the driver as every rank's traceback.
        return {"non_finite_loss": exc.to_dict()}
    except JobInputError as exc:  # every rank finds the same, as above (switchyard.train.job_errors)
        return {INPUT_ERROR_KEY: str(exc)}
    log.info("rank %d finished: %s", rank, result.to_json())
    return None


def _reporter(job: str, workload_id: str | None, rank: int) -> Callable[[dict[str, Any]], None]:
    """Each metrics line to Ray Train (Train V2 keeps only checkpoint reports) and, from rank 0,
    to the run's gauges (`run_gauges`)."""
    gauges = RunGauges(job, workload_id) if rank == 0 else None

    def report(line: dict[str, Any]) -> None:
        if gauges is not None:
            gauges(line)
        ray.train.report(line)  # the loop leaves None values out of the line

    return report


def raise_non_finite_loss(return_value: Any) -> None:
    """Raise on the driver the `NonFiniteLossError` rank 0's `train_fn` returned, as
    `run_local` does for local ranks: the CLI prints its one line and exits 1."""
    if isinstance(return_value, dict) and "non_finite_loss" in return_value:
        raise NonFiniteLossError(**return_value["non_finite_loss"])


def _resume_reporter(workload_id: str) -> Callable[[int, str], None]:
    """Tell the scheduler where the job resumed (its event log; fire and forget)."""
    from switchyard.cluster.scheduler_client import platform_scheduler

    scheduler = platform_scheduler()
    return lambda step, uri: scheduler.report_resume(workload_id, step, uri, wait=False)


def _scheduler_reporter(workload_id: str) -> Callable[[], None]:
    """Report each published checkpoint to the scheduler, so victim selection knows how much
    work a preemption would lose (fire and forget: the report is advisory)."""
    from switchyard.cluster.scheduler_client import platform_scheduler

    scheduler = platform_scheduler()
    return lambda: scheduler.report_checkpoint(workload_id, wait=False)


class _DriverSigterm:
    """`ray job stop` sends SIGTERM to the driver: turn it into a preemption notice so the
    workers checkpoint before they go, instead of dying mid-step."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.previous: Any = None

    def __enter__(self) -> _DriverSigterm:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handle)
        else:
            log.info("driver SIGTERM not hooked: fit() is not on the main thread")
        return self

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        log.warning("driver got SIGTERM: asking job %s to checkpoint and stop", self.job_id)
        GcsPreemptionChannel().send_notice(self.job_id, "SIGTERM on driver")

    def __exit__(self, *exc: object) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def run_on_ray(
    spec: JobSpec,
    *,
    storage_path: str | None = None,
    job_id: str | None = None,
    stop_after_steps: int | None = None,
    worker_label_selectors: list[dict[str, str]] | None = None,
    workload_id: str | None = None,
    team: str | None = None,
) -> TrainResult:
    """Run `spec` with `TorchTrainer` on the connected Ray cluster; blocks until it ends.

    With `worker_label_selectors` (from the scheduler's lease: one per worker, naming its
    node) every worker holds one granted GPU on the node the scheduler chose; `workload_id`
    names the scheduler workload whose checkpoints are reported. A job run for a `team` keeps
    its run directory under the team's (`<storage>/<team>/<name>`): two teams' jobs of one
    name shared `<storage>/<name>`, and the second resumed from the first's checkpoint.
    Raises `NonFiniteLossError` when the loss became non-finite."""
    storage = storage_path or spec.checkpoint.uri or str(state_dir() / "train" / "checkpoints")
    storage = team_storage(storage, team)
    job_id = job_id or spec.name
    use_gpu = spec.use_gpu or worker_label_selectors is not None  # a lease is GPUs: workers hold them
    trainer = TorchTrainer(
        train_fn,
        train_loop_config={
            "spec": spec.model_dump(mode="json"),
            "job_id": job_id,
            "run_uri": f"{storage}/{spec.name}",
            "stop_after_steps": stop_after_steps,
            "workload_id": workload_id,
            "team": team,
        },
        # gloo must be named when there are no GPUs: Ray may hand out logical GPUs. On GPUs, CPU
        # tensors still need gloo (offloaded DTensors' grad-norm, the async saves' group), as
        # the local launcher does (`launch.py`); Ray accepts the per-device list.
        torch_config=TorchConfig(backend=process_group_backend(use_gpu and torch.cuda.is_available())),
        scaling_config=ScalingConfig(
            num_workers=len(worker_label_selectors) if worker_label_selectors else spec.num_workers,
            use_gpu=use_gpu,  # Ray's default: 1 CPU (+ 1 GPU), one rank per GPU (spec.gpus_per_worker is 1)
            label_selector=worker_label_selectors,
        ),
        run_config=RunConfig(
            name=spec.name,
            storage_path=storage,
            checkpoint_config=CheckpointConfig(num_to_keep=spec.checkpoint.keep),
            failure_config=FailureConfig(max_failures=0),
        ),
    )
    with _DriverSigterm(job_id):
        result = trainer.fit()
    raise_non_finite_loss(result.return_value)
    raise_input_error(result.return_value)
    metrics = dict(result.metrics or {})
    fields = ("job", "status", "step", "loss", "checkpoint", "resumable", "resumed_from", "reason")
    missing = [f for f in fields if f not in metrics]
    if missing:
        # The outcome rides on the last checkpoint's metrics (Ray returns those).
        raise RuntimeError(
            f"job {spec.name} ended without a final checkpoint report (missing {missing}); "
            "Ray jobs need checkpoint.save_final: true"
        )
    outcome: dict[str, Any] = {f: metrics[f] for f in fields}
    outcome.update({f: metrics.get(f) for f in (*LINE_FIELDS, "metrics_file")})
    return TrainResult(**outcome)
