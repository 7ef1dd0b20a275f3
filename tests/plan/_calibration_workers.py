"""Run inside a spawned gloo group by test_plan_calibration_comm.py (spawned children import
this module by name): each job spec is built and stepped by the trainer's own code
(`build_model`, `build_engine`, `train_step`), and the bytes each rank sends in its
collectives are counted per optimizer step."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from switchyard.train.launch import spawn_group
from switchyard.train.loop import build_engine, build_model
from switchyard.train.spec import JobSpec
from tests._collectives import CollectiveCounter

Measured = list[list[list[list[dict[str, Any]]]]]
"""[rank][job][step] -> the collective calls of that optimizer step."""
STEPS = 2
"""The first step also runs lazy initialisation and DeepSpeed's module tracing; the second is
the steady state the planner prices."""


def _micro_batches(spec: JobSpec, generator: torch.Generator) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out = []
    for _ in range(spec.data.grad_accum_steps):
        x = torch.randint(0, 256, (spec.data.micro_batch_size, spec.data.seq_len + 1), generator=generator)
        out.append((x[:, :-1], x[:, 1:]))
    return out


def _steps(spec: JobSpec, rank: int, world_size: int) -> list[list[dict[str, Any]]]:
    device = torch.device("cpu")
    engine = build_engine(build_model(spec, device, None), spec, device, world_size)
    generator = torch.Generator().manual_seed(100 + rank)
    steps = []
    for _ in range(STEPS):
        micro = _micro_batches(spec, generator)
        with CollectiveCounter() as counter:
            engine.train_step(micro, spec.optim.lr)
        steps.append([c.as_dict() for c in counter.calls])
    return steps


def measure_traffic(rank: int, world_size: int, specs: list[str], out_path: str) -> None:
    """Per job spec (JSON), per step, this rank's collective calls; rank 0 writes every rank's."""
    # More ranks than cores: one thread each, or gloo's waits and torch's thread pools contend.
    torch.set_num_threads(1)
    measured = [_steps(JobSpec.model_validate_json(s), rank, world_size) for s in specs]
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, measured)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))


def count_traffic(specs: list[JobSpec], world_size: int) -> Measured:
    """Every job in one spawned group of `world_size` gloo ranks."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "traffic.json"
        spawn_group(measure_traffic, world_size, [s.model_dump_json() for s in specs], str(out), finished=out.is_file)
        measured: Measured = json.loads(out.read_text())
    return measured


def sent_per_rank(measured: Measured, job: int) -> list[int]:
    """Bytes each rank sent in job `job`'s steady-state (last) step."""
    return [sum(call["sent"] for call in ranks[job][STEPS - 1]) for ranks in measured]
