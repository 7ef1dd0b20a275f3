"""DDP and FSDP2 training with a torch AdamW, checkpointed with torch.distributed.checkpoint.

Saves can run in the background (`start_save`: DCP's `async_save`, staged into host memory
that is reused from save to save, pinned on a GPU). Loads read DCP's items straight from the
checkpoint store (`ShardReader`): each rank fetches only the items its own shards need, and
verifies each against its digest in the manifest.
"""

from __future__ import annotations

import contextlib
import io
import pickle
from collections.abc import Collection
from concurrent.futures import Future
from pathlib import Path
from typing import Any, cast

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint import CheckpointException, StorageReader
from torch.distributed.checkpoint.planner import LoadItemType
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from switchyard.models import GPT, next_token_loss
from switchyard.train.checkpoint import CheckpointError, CheckpointFiles, ItemRanges, agreed
from switchyard.train.engine import Batch, StepOutput
from switchyard.train.materialize import is_meta, materialize
from switchyard.train.memory import RankMemory, grad_bytes, held_grad_bytes, optimizer_state_bytes, param_bytes
from switchyard.train.optimizer import adamw
from switchyard.train.parallelize import apply_ddp, apply_fsdp
from switchyard.train.spec import JobSpec
from switchyard.train.strategy import Offload, Strategy


class TorchEngine:
    checkpoint_format = "dcp"

    def __init__(
        self,
        model: GPT,
        spec: JobSpec,
        *,
        device: torch.device,
        world_size: int,
        bf16: bool,
        ranks_per_node: int | None = None,
    ) -> None:
        """`model` may be on the meta device: it is then given storage only after sharding.
        `ranks_per_node` (default: all) sets fsdp-hybrid's default layout."""
        par = spec.parallel
        on_meta = is_meta(model)
        self.strategy = par.strategy
        self.device = device
        self.bf16 = bf16
        self.grad_clip = spec.optim.grad_clip
        if par.strategy is Strategy.DDP:
            if on_meta:
                materialize(model, device, spec.seed)  # DDP replicates: every rank holds it all
            self.model: nn.Module = apply_ddp(model, device)
        else:
            if not on_meta:
                model.to(device)
            self.model = apply_fsdp(
                model,
                par.strategy,
                world_size=world_size,
                device_type=device.type,
                wrap=par.wrap,
                param_dtype=torch.bfloat16 if bf16 else None,
                offload=par.offload,
                replicate_degree=par.replicate_degree,
                ranks_per_node=ranks_per_node,
            )
            if on_meta:
                # With CPU offload the shards live on the host; FSDP moves them per unit.
                materialize(model, torch.device("cpu") if par.offload is Offload.CPU else device, spec.seed)
        # Fused on a GPU, the per-tensor loop on the host (`switchyard.train.optimizer`).
        self.optimizer = adamw(self.model.parameters(), spec.optim, device, offloaded=par.offload is Offload.CPU)
        self.probes: dict[str, RankMemory] = {}
        """Bytes held at points inside the first step, filled when `probe_memory` is set:
        SHARD_GRAD_OP only differs from FULL_SHARD between forward and backward."""
        self.probe_memory = False
        self.peak_grad_bytes = 0
        """With `probe_memory`: the most gradient bytes held after any micro-batch's backward."""
        self._stager: DefaultStager | None = None

    def _grad_sync(self, last: bool) -> contextlib.AbstractContextManager[None]:
        """Gradient reduction during accumulation. Replicated strategies (DDP, NO_SHARD)
        reduce once, on the last micro-batch: their gradients are whole anyway. Sharded
        ones reduce-scatter every micro-batch, so only a shard is ever accumulated (a
        skipped reduce-scatter would keep every unit's whole gradient until the last one);
        HSDP skips only the all-reduce across replicas until the last micro-batch."""
        if isinstance(self.model, DistributedDataParallel):
            return contextlib.nullcontext() if last else self.model.no_sync()
        fsdp = cast(FSDPModule, self.model)
        if self.strategy is Strategy.FSDP_NO_SHARD:
            fsdp.set_requires_gradient_sync(last)
        elif self.strategy is Strategy.FSDP_HYBRID:
            fsdp.set_requires_all_reduce(last)
        return contextlib.nullcontext()

    def _autocast(self) -> contextlib.AbstractContextManager[None]:
        # FSDP casts parameters itself (mp_policy); DDP needs autocast for bf16 compute.
        if self.bf16 and isinstance(self.model, DistributedDataParallel):
            autocast: contextlib.AbstractContextManager[None] = torch.autocast(self.device.type, dtype=torch.bfloat16)
            return autocast
        return contextlib.nullcontext()

    def train_step(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for i, (x, y) in enumerate(micro_batches):
            with self._grad_sync(i == len(micro_batches) - 1), self._autocast():
                loss = next_token_loss(self.model(x), y)
                if self.probe_memory:
                    self.probes.setdefault("after_forward", self.memory())
                (loss / len(micro_batches)).backward()
            if self.probe_memory:
                self.peak_grad_bytes = max(self.peak_grad_bytes, held_grad_bytes(self.model))
            total += loss.detach()
        grad_norm = self._grad_norm_and_clip()
        if self.probe_memory:
            self.probes.setdefault("after_backward", self.memory())
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutput(total / len(micro_batches), grad_norm)

    def evaluate(self, batches: list[Batch]) -> Tensor:
        self.model.eval()
        total = torch.zeros((), device=self.device)
        try:
            for x, y in batches:
                with torch.no_grad(), self._autocast():
                    total += next_token_loss(self.model(x), y) * y.numel()
        finally:
            self.model.train()
        return total

    def _grad_norm_and_clip(self) -> Tensor:
        """The total gradient norm before clipping, then clipping to it: what
        `clip_grad_norm_` does, with the norm made whole first (torchtitan does the same)."""
        params = [p for p in self.model.parameters() if p.grad is not None]
        norm = torch.nn.utils.get_total_norm([p.grad for p in params])
        if isinstance(norm, DTensor):
            norm = norm.full_tensor()  # FSDP: a partial norm per shard; one scalar all-reduce
        if self.grad_clip > 0:
            torch.nn.utils.clip_grads_with_norm_(params, self.grad_clip, norm)
        return norm.detach()

    def _state(self) -> dict[str, object]:
        model_state, optim_state = get_state_dict(self.model, self.optimizer)
        return {"model": model_state, "optim": optim_state}

    def save(self, directory: Path) -> None:
        self.save_items(directory)

    def save_items(self, directory: Path) -> ItemRanges:
        return item_ranges(dcp.save(self._state(), checkpoint_id=directory))

    def start_save(self, directory: Path, group: Any) -> Future[ItemRanges]:
        """DCP's `async_save`: returns once the state is copied into host memory (the next
        optimizer step may then change the live tensors); the write runs in a thread, its
        collectives on `group`, which must handle CPU tensors (gloo) and be used by nothing
        else meanwhile. The staging buffers are reused: the previous write must be done."""
        if self._stager is None:
            # Synchronous staging (a copy that blocks the loop) into buffers kept from save to
            # save; on a GPU pinned, copied with non_blocking then one synchronize.
            cuda = torch.cuda.is_available()
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda
                )
            )
        response = dcp.async_save(
            self._state(), checkpoint_id=directory, process_group=group, async_stager=self._stager
        )
        written = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        ranges: Future[ItemRanges] = Future()

        def done(future: Future[Any]) -> None:
            try:
                ranges.set_result(item_ranges(future.result()))
            except (Exception, CheckpointException) as exc:  # noqa: BLE001  (handed on: `ranges.result()` raises it)
                ranges.set_exception(exc)

        written.add_done_callback(done)
        return ranges

    def load(self, directory: Path) -> None:
        self._load(dcp.FileSystemReader(directory))

    def load_items(self, files: CheckpointFiles) -> None:
        """Restore from the store, reading only the items this rank's shards need."""
        self._load(ShardReader(files))

    def _load(self, reader: StorageReader) -> None:
        state = self._state()
        load_state(state, reader)
        set_state_dict(
            self.model,
            self.optimizer,
            model_state_dict=state["model"],  # type: ignore[arg-type]
            optim_state_dict=state["optim"],  # type: ignore[arg-type]
        )

    def memory(self) -> RankMemory:
        params = list(self.model.parameters())
        return RankMemory(
            params=param_bytes(params),
            grads=grad_bytes(params),
            optimizer_state=optimizer_state_bytes(self.optimizer),
        )


def item_ranges(metadata: Any) -> ItemRanges:
    """Where DCP stored each item: file -> [(offset, length)] (from a save's `Metadata`)."""
    ranges: ItemRanges = {}
    for info in metadata.storage_data.values():
        ranges.setdefault(info.relative_path, []).append((info.offset, info.length))
    return ranges


def load_state(state: dict[str, Any], reader: StorageReader) -> None:
    """`dcp.load` whose failures (on any rank, raised on every rank alike) are a
    `CheckpointError` naming each rank's problem."""
    try:
        dcp.load(state, storage_reader=reader)
    except CheckpointException as exc:
        problems = "; ".join(f"rank {rank}: {failure[0]}" for rank, failure in sorted(exc.failures.items()))
        raise CheckpointError(problems) from None


def load_dcp_weights(model: nn.Module, files: CheckpointFiles) -> None:
    """`init_from`: only the model weights of a DCP checkpoint into a plain model. Its state
    dict has the names of FSDP's / DDP's, and DCP reads (and reshards) only the keys asked
    for: the optimizer's items are never fetched."""
    state: dict[str, Any] = {"model": model.state_dict()}
    load_state(state, ShardReader(files))
    model.load_state_dict(state["model"])


DCP_METADATA = ".metadata"


def _narrow(tensor: Tensor, offsets: Collection[int], lengths: Collection[int]) -> Tensor:
    for dim, (offset, length) in enumerate(zip(offsets, lengths, strict=True)):
        if offset != 0 or length != tensor.size(dim):
            tensor = tensor.narrow(dim, offset, length)
    return tensor


class ShardReader(StorageReader):
    """DCP's reads straight from the checkpoint store: `.metadata` (every rank), then only
    the items in this rank's load plan, fetched by byte range and each checked against its
    digest (`CheckpointFiles`). Nothing is copied to local disk."""

    def __init__(self, files: CheckpointFiles) -> None:
        super().__init__()
        # Read before `dcp.load`, agreed by every rank: DCP would turn a failed metadata read
        # into "metadata is None" after a fallback attempt.
        self.metadata = agreed(lambda: pickle.loads(files.read(DCP_METADATA)))
        self.files = files
        self.storage_data: dict[Any, Any] = {}

    def reset(self, checkpoint_id: Any = None) -> None:
        self.storage_data = {}

    def read_metadata(self) -> Any:
        return self.metadata

    def set_up_storage_reader(self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage_data = metadata.storage_data

    def prepare_local_plan(self, plan: Any) -> Any:
        return plan

    def prepare_global_plan(self, plans: list[Any]) -> list[Any]:
        return plans

    def read_data(self, plan: Any, planner: Any) -> torch.futures.Future[None]:
        # Several requests may read one stored item (resharding): fetch and verify it once.
        by_item: dict[str, dict[tuple[int, int], list[Any]]] = {}
        for request in plan.items:
            info = self.storage_data[request.storage_index]
            if info.transform_descriptors:
                raise CheckpointError(f"{info.relative_path}: stream transforms are not supported")
            by_item.setdefault(info.relative_path, {}).setdefault((info.offset, info.length), []).append(request)
        for relpath, items in by_item.items():
            for offset, length, raw in self.files.read_items(relpath, items):
                stored: Tensor | None = None
                for request in items[(offset, length)]:
                    if request.type == LoadItemType.BYTE_IO:
                        planner.load_bytes(request, io.BytesIO(raw))
                        continue
                    if stored is None:
                        stored = torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
                    self._copy(request, stored, planner)
        done: torch.futures.Future[None] = torch.futures.Future()  # what DCP waits on
        done.set_result(None)
        return done

    def _copy(self, request: Any, stored: Tensor, planner: Any) -> None:
        tensor = _narrow(stored, request.storage_offsets, request.lengths)
        target = planner.resolve_tensor(request).detach()
        if target.size() != tensor.size():
            fqn = request.storage_index.fqn
            raise CheckpointError(f"{fqn}: stored {tuple(tensor.size())}, wants {tuple(target.size())}")
        target.copy_(tensor)
        planner.commit_tensor(request, target)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: Any) -> bool:
        return False
