"""Spawned workers that count the bytes DeepSpeed sends through torch.distributed.

A module of its own because spawned children import functions by name (`_workers.py`).
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from switchyard.train import deepspeed_engine
from switchyard.train.loop import build_engine, build_model
from switchyard.train.spec import JobSpec

STEPS = 3
CURRENT_CONFIG = deepspeed_engine.deepspeed_config


PAYLOAD = {
    "all_reduce": "tensor",
    "reduce": "tensor",
    "broadcast": "tensor",
    "all_gather_into_tensor": "input_tensor",
    "all_gather": "tensor",
    "reduce_scatter_tensor": "input",
}
"""Per collective wrapped, the argument whose bytes it moves (a gather's: this rank's shard)."""


def _sent(op: str, args: dict[str, Any], m: int, rank: int, n: int) -> int:
    """Bytes this rank sends for a collective over `m` payload bytes: ring costs for the
    symmetric collectives; in a rooted one every rank but the root sends the buffer (with
    two ranks, the only way to do either)."""
    if op == "all_reduce":
        return 2 * (n - 1) * m // n
    if op == "reduce":
        return 0 if args.get("dst") == rank else m
    if op == "broadcast":
        return m if args.get("src") == rank else 0
    if op in ("all_gather_into_tensor", "all_gather"):
        return (n - 1) * m  # this rank's shard to each of the others
    return (n - 1) * m // n  # reduce_scatter_tensor


class CollectiveLog:
    """Wraps torch.distributed's collectives; while recording, logs each call's op, dtype,
    element count and bytes sent. Install it before DeepSpeed's comm backend starts: that
    backend keeps references to `all_gather_into_tensor` and `reduce_scatter_tensor`."""

    def __init__(self, rank: int, world_size: int) -> None:
        self.rank, self.world_size = rank, world_size
        self.calls: list[dict[str, Any]] | None = None

    def install(self) -> None:
        for op in PAYLOAD:
            wrapped = self._wrap(op, getattr(c10d, op))
            setattr(c10d, op, wrapped)
            setattr(dist, op, wrapped)

    def _wrap(self, op: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(fn)

        def counted(*args: Any, **kwargs: Any) -> Any:
            if self.calls is not None:
                bound = signature.bind(*args, **kwargs).arguments
                payload = bound[PAYLOAD[op]]
                m = payload.numel() * payload.element_size()
                sent = _sent(op, bound, m, self.rank, self.world_size)
                self.calls.append(
                    {"op": op, "dtype": str(payload.dtype), "numel": payload.numel(), "bytes": m, "sent": sent}
                )
            return fn(*args, **kwargs)

        return counted

    @contextmanager
    def recording(self) -> Iterator[list[dict[str, Any]]]:
        self.calls = calls = []
        try:
            yield calls
        finally:
            self.calls = None


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
    log = CollectiveLog(rank, world_size)
    log.install()
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
            with log.recording() as calls:
                loss = engine.train_step(micro, 3e-3).loss.detach().clone()
            dist.all_reduce(loss)
            steps.append({"loss": float(loss) / world_size, "calls": calls})
        results.append({"job": spec.name, "legacy": entry["legacy"], "steps": steps})
        del engine
    gathered: list[Any] = [None] * world_size
    dist.all_gather_object(gathered, results)
    if rank == 0:
        Path(out_path).write_text(json.dumps(gathered))
