"""Run a job on this machine: N processes in one torch.distributed group (gloo on CPU,
NCCL on GPU). Used by `switchyard train run`, the tests and the benchmarks; Ray Train jobs
go through `switchyard.train.ray_trainer` instead.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from switchyard.ports import listener_port
from switchyard.state import state_dir
from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.job_errors import INPUT_ERROR_KEY, JobInputError, raise_input_error
from switchyard.train.loop import RunContext, Trainer, TrainResult
from switchyard.train.preemption import FilePreemptionChannel
from switchyard.train.spec import JobSpec
from switchyard.train.step_sync import NonFiniteLossError

GroupFn = Callable[..., None]
log = logging.getLogger(__name__)


def local_device(rank: int) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def _group_entry(rank: int, fn: GroupFn, world_size: int, port: int, args: tuple[Any, ...]) -> None:
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(levelname)s %(name)s: %(message)s")
    # The variables torchrun sets: DeepSpeed (and user code) read them.
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    device = local_device(rank)
    backend = process_group_backend(device.type == "cuda")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def spawn_group(fn: GroupFn, nproc: int, *args: Any, finished: Callable[[], bool] | None = None) -> None:
    """Run `fn(rank, world_size, *args)` in `nproc` fresh processes joined in one group.
    `fn` must be importable by name (module-level) because the children are spawned.

    `finished` says whether the work's results were written: a child killed by a signal
    after that (a rare SIGABRT in gloo teardown under heavy load) is logged, not raised.
    """
    try:
        mp.start_processes(_group_entry, args=(fn, nproc, listener_port(), args), nprocs=nproc, start_method="spawn")
    except mp.ProcessExitedException as exc:
        if finished is None or not finished():
            raise
        log.warning("rank %d exited by signal after its results were written: %s", exc.error_index, exc)


def team_storage(storage: str, team: str | None) -> str:
    """Where a team's run directories go under a checkpoint root: `<root>/<team>` (the root
    itself for a run with no team, such as a local `train run`)."""
    storage = storage.rstrip("/")
    return f"{storage}/{team}" if team else storage


def checkpoint_root(spec: JobSpec) -> str:
    """Where a job's checkpoint folders go, local and on Ray alike: `<uri>/<job name>/`."""
    root = (spec.checkpoint.uri or str(state_dir() / "train" / "checkpoints")).rstrip("/")
    return f"{root}/{spec.name}"


def run_on_rank(
    rank: int,
    world_size: int,
    spec_json: str,
    job_id: str,
    notice_dir: str,
    result_path: str,
    overrides: dict[str, Any],
) -> None:
    """One rank of a local job; rank 0 writes the result JSON to `result_path`."""
    spec = JobSpec.model_validate_json(spec_json)
    device = local_device(rank)
    work_dir = Path(tempfile.mkdtemp(prefix=f"switchyard-{spec.name}-r{rank}-"))
    ctx = RunContext(
        rank=rank,
        world_size=world_size,
        device=device,
        job_id=job_id,
        store=CheckpointStore(checkpoint_root(spec), work_dir / "checkpoints"),
        work_dir=work_dir,
        channel=FilePreemptionChannel(notice_dir),
        **overrides,
    )
    try:
        result = Trainer(spec, ctx).run()
    except NonFiniteLossError as exc:
        # Every rank stops at the same step; the launcher re-raises it, without the ranks' tracebacks.
        if rank == 0:
            Path(result_path).write_text(json.dumps({"non_finite_loss": exc.to_dict()}))
        return
    except JobInputError as exc:  # every rank finds the same (switchyard.train.job_errors)
        if rank == 0:
            Path(result_path).write_text(json.dumps({INPUT_ERROR_KEY: str(exc)}))
        return
    if rank == 0:
        payload = {**json.loads(result.to_json()), "losses": result.losses}
        Path(result_path).write_text(json.dumps(payload))


def run_local(
    spec: JobSpec,
    *,
    nproc: int | None = None,
    job_id: str | None = None,
    notice_dir: str | os.PathLike[str] | None = None,
    profile_dir: str | None = None,
    **overrides: Any,
) -> TrainResult:
    """Train `spec` on this machine with `nproc` ranks (default `spec.num_workers`)."""
    nproc = nproc or spec.num_workers
    if profile_dir is not None:
        overrides["profile_dir"] = Path(profile_dir)
    job_id = job_id or spec.name
    notices = Path(notice_dir) if notice_dir else state_dir() / "train" / "notices"
    with tempfile.TemporaryDirectory(prefix="switchyard-result-") as tmp:
        result_path = Path(tmp) / "result.json"
        spawn_group(
            run_on_rank,
            nproc,
            spec.model_dump_json(),
            job_id,
            str(notices),
            str(result_path),
            overrides,
            finished=result_path.is_file,
        )
        data = json.loads(result_path.read_text())
    if "non_finite_loss" in data:
        raise NonFiniteLossError(**data["non_finite_loss"])
    raise_input_error(data)
    return TrainResult(**data)


def process_group_backend(cuda: bool) -> str:
    """gloo for CPU tensors always (collectives on CPU objects, offloaded DTensors); NCCL for
    CUDA tensors. Ray's TorchConfig takes the same per-device list."""
    return "cpu:gloo,cuda:nccl" if cuda else "gloo"
