"""A Ray Tune sweep (learning rate x micro-batch size) over the same `Trainer` loop.

Without GPUs, each trial trains the job on one CPU rank (a one-process gloo group, so every
strategy's code path runs unchanged) and reports each metrics line to Tune; no scheduler is
involved. A trial that needs GPUs asks the platform's scheduler for them like any job: it
submits a workload for its team and priority, waits in the queue (holding nothing), runs
`run_on_ray` (one TorchTrainer worker per granted GPU, pinned to the granted nodes) and
releases the lease when done or on failure. A preempted trial checkpoints, waits to be
admitted again and resumes. The trial itself takes only a CPU from Tune: its GPUs come from
the lease, never from Tune's own resource request, which the scheduler could not place.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from pydantic import ValidationError
from ray import tune

from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.loop import RunContext, Trainer
from switchyard.train.spec import JobSpec


def trial_spec(spec: JobSpec, lr: float, batch_size: int, **changes: Any) -> JobSpec:
    """The job as the trial of (`lr`, `batch_size`) runs it; a `ValueError` names the trial's
    values and the field they break."""
    try:
        return spec.with_changes(**changes, **{"optim.lr": lr, "data.micro_batch_size": batch_size})
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the spec"
        raise ValueError(f"the trial of --lr {lr} --batch-size {batch_size}: {where}: {first['msg']}") from None


def check_grid(spec: JobSpec, lrs: list[float], batch_sizes: list[int], gpus_per_trial: int) -> None:
    """Every trial's spec, before any trial starts: a value no trial can run (an lr of 0 or
    inf, a batch size of 0, one the validation split cannot divide) failed each trial in Tune
    and then the whole sweep with every trial's traceback."""
    for lr in lrs:
        for batch_size in batch_sizes:
            trial_spec(spec, lr, batch_size, num_workers=max(1, gpus_per_trial))


def trial_fn(config: dict[str, Any]) -> None:
    """One Tune trial: the job with this trial's `lr` and `batch_size` on one rank."""
    spec = trial_spec(
        JobSpec.model_validate(config["spec"]),
        config["lr"],
        config["batch_size"],
        num_workers=1,
        **{"checkpoint.save_final": False, "checkpoint.resume": False},
    )
    work = Path(tempfile.mkdtemp(prefix="switchyard-sweep-"))
    # A process group of one, so DDP/FSDP wrap exactly as in a real job.
    dist.init_process_group("gloo", init_method=f"file://{work / 'pg'}", rank=0, world_size=1)
    try:
        ctx = RunContext(
            rank=0,
            world_size=1,
            device=torch.device("cpu"),
            job_id=f"{spec.name}-sweep",
            store=CheckpointStore(str(work / "ckpt"), work / "cache"),
            work_dir=work,
            report_metrics=tune.report,
            handle_sigterm=False,
        )
        Trainer(spec, ctx).run()
    finally:
        dist.destroy_process_group()


def leased_trial_fn(config: dict[str, Any]) -> None:
    """One Tune trial on GPUs leased from the scheduler (see the module docstring)."""
    from switchyard.cluster.admission import admit, submit, training_submission
    from switchyard.train.ray_trainer import run_on_ray

    trial = tune.get_context().get_trial_id().lower().replace("_", "-")
    gpus = int(config["gpus_per_trial"])
    spec = JobSpec.model_validate(config["spec"])
    spec = trial_spec(
        spec,
        config["lr"],
        config["batch_size"],
        name=f"{spec.name[:40]}-{trial}"[:63],
        num_workers=gpus,
        **{
            "checkpoint.save_final": True,  # run_on_ray reads the outcome from the last report
            "checkpoint.resume": True,  # a preempted trial resumes where it stopped
        },
    )
    workload = submit(training_submission(spec.name, gpus, config["team"], config["priority_class"]))
    while True:
        admission = admit(None, workload_id=workload)
        finished = True  # a failed trial gives its GPUs back for good
        try:
            result = run_on_ray(
                spec,
                team=config["team"],
                storage_path=config["storage_path"],
                job_id=workload,
                worker_label_selectors=admission.worker_label_selectors(),
                workload_id=workload,
            )
            finished = not result.resumable
        finally:
            requeued = admission.release(finished=finished)
        if not requeued:
            break
    tune.report({"loss": result.loss, "step": result.step, "status": result.status, "workload_id": workload})


def run_sweep(
    spec: JobSpec,
    lrs: list[float],
    batch_sizes: list[int],
    *,
    storage_path: str,
    gpus_per_trial: int = 0,
    team: str | None = None,
    priority_class: str = "training",
) -> list[dict[str, Any]]:
    """Grid over `lrs` x `batch_sizes`; rows sorted by final loss, best first. With
    `gpus_per_trial`, each trial's GPUs are leased from the scheduler against `team`'s quota."""
    if gpus_per_trial < 0:
        raise ValueError(f"gpus_per_trial must be 0 (CPU trials) or more, got {gpus_per_trial}")
    check_grid(spec, lrs, batch_sizes, gpus_per_trial)
    space: dict[str, Any] = {
        "spec": spec.model_dump(mode="json"),
        "lr": tune.grid_search(lrs),
        "batch_size": tune.grid_search(batch_sizes),
    }
    if gpus_per_trial:
        if not team:
            raise ValueError("a sweep whose trials need GPUs needs a team: GPUs are granted against its quota")
        trainable = tune.with_resources(leased_trial_fn, {"cpu": 1})
        space.update(
            gpus_per_trial=gpus_per_trial,
            team=team,
            priority_class=priority_class,
            storage_path=f"{storage_path.rstrip('/')}/trials",
        )
    else:
        trainable = tune.with_resources(trial_fn, {"cpu": 1})
    tuner = tune.Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=f"{spec.name}-sweep", storage_path=storage_path, verbose=0),
    )
    results = tuner.fit()
    rows = []
    for result in results:
        if result.error is not None:
            raise RuntimeError(f"sweep trial {result.config} failed: {result.error}")
        metrics = result.metrics or {}
        row = {
            "lr": result.config["lr"],
            "batch_size": result.config["batch_size"],
            "loss": metrics["loss"],
            "step": metrics["step"],
        }
        if "workload_id" in metrics:
            row["workload_id"] = metrics["workload_id"]
        rows.append(row)
    return sorted(rows, key=lambda r: r["loss"])
