"""Spawned workers that count the bytes DeepSpeed sends through torch.distributed, with the
counter the planner's calibration uses too (`tests/_collectives.py`).

A module of its own because spawned children import functions by name (`_workers.py`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from switchyard.train import deepspeed_engine
from switchyard.train.loop import build_engine, build_model
from switchyard.train.spec import JobSpec
from tests._collectives import CollectiveCounter

STEPS = 3
CURRENT_CONFIG = deepspeed_engine.deepspeed_config


def todays_config(spec: JobSpec, *, bf16: bool) -> dict[str, Any]:
    """The trainer's DeepSpeed config before it set gradient reduction: DeepSpeed's defaults
    (bucket all-reduce at stages 1/2, no overlap there, reduction and accumulation in bf16)."""
    config = CURRENT_CONFIG(spec, bf16=bf16)
    kept = ("stage", "offload_optimizer", "offload_param")
    zero = {k: v for k, v in config["zero_optimization"].items() if k in kept}
    rest = {k: v for k, v in config.items() if k not in ("communication_data_type", "data_types")}
    return {**rest, "zero_optimization": zero}


@contextmanager
def _config(legacy: bool) -> Iterator[None]:
    deepspeed_engine.deepspeed_config = todays_config if legacy else CURRENT_CONFIG  # type: ignore[assignment]
    try:
        yield
    finally:
        deepspeed_engine.deepspeed_config = CURRENT_CONFIG  # type: ignore[assignment]


def zero_traffic(rank: int, world_size: int, jobs: list[dict[str, Any]], out_path: str) -> None:
    """Per job (`spec`, `legacy`: today's config): STEPS optimizer steps on fixed per-rank
    batches; per step the mean loss over ranks and this rank's collective calls inside
    `train_step`. Rank 0 writes every rank's results."""
    device = torch.device("cpu")
    results = []
    for entry in jobs:
        spec = JobSpec.model_validate_json(entry["spec"])
        with _config(entry["legacy"]):
            engine = build_engine(build_model(spec, device, None), spec, device, world_size)
        g = torch.Generator().manual_seed(100 + rank)
        steps = []
        for _ in range(STEPS):
            micro = []
            for _ in range(spec.data.grad_accum_steps):
                x = torch.randint(0, 256, (spec.data.micro_batch_size, spec.data.seq_len + 1), generator=g)
                micro.append((x[:, :-1], x[:, 1:]))
            with CollectiveCounter() as counter:
                loss = engine.train_step(micro, 3e-3).loss.detach().clone()
            dist.all_reduce(loss)
            steps.append({"loss": float(loss) / world_size, "calls": [c.as_dict() for c in counter.calls]})
        results.append({"job": spec.name, "legacy": entry["legacy"], "steps": steps})
        del engine
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
