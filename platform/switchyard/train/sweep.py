"""A Ray Tune sweep (learning rate x micro-batch size) over the same `Trainer` loop.

Each trial trains the job on one CPU rank (a one-process gloo group, so every strategy's
code path runs unchanged) and reports the loss per step to Tune. For multi-rank trials,
run `run_on_ray` per configuration instead: one Tune trial per TorchTrainer.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from ray import tune

from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.loop import RunContext, Trainer
from switchyard.train.spec import JobSpec


def trial_fn(config: dict[str, Any]) -> None:
    """One Tune trial: the job with this trial's `lr` and `batch_size` on one rank."""
    spec = JobSpec.model_validate(config["spec"]).with_changes(
        num_workers=1,
        **{
            "optim.lr": config["lr"],
            "data.micro_batch_size": config["batch_size"],
            "checkpoint.save_final": False,
            "checkpoint.resume": False,
        },
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


def run_sweep(spec: JobSpec, lrs: list[float], batch_sizes: list[int], *, storage_path: str) -> list[dict[str, Any]]:
    """Grid over `lrs` x `batch_sizes`; rows sorted by final loss, best first."""
    tuner = tune.Tuner(
        tune.with_resources(trial_fn, {"cpu": 1}),
        param_space={
            "spec": spec.model_dump(mode="json"),
            "lr": tune.grid_search(lrs),
            "batch_size": tune.grid_search(batch_sizes),
        },
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=f"{spec.name}-sweep", storage_path=storage_path, verbose=0),
    )
    results = tuner.fit()
    rows = []
    for result in results:
        if result.error is not None:
            raise RuntimeError(f"sweep trial {result.config} failed: {result.error}")
        metrics = result.metrics or {}
        rows.append(
            {
                "lr": result.config["lr"],
                "batch_size": result.config["batch_size"],
                "loss": metrics["loss"],
                "step": metrics["step"],
            }
        )
    return sorted(rows, key=lambda r: r["loss"])
