"""DDP and FSDP2 training with a torch AdamW, checkpointed with torch.distributed.checkpoint."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import cast

import torch
import torch.distributed.checkpoint as dcp
from torch import Tensor, nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from switchyard.models import GPT, next_token_loss
from switchyard.train.engine import Batch, StepOutput
from switchyard.train.materialize import is_meta, materialize
from switchyard.train.memory import RankMemory, grad_bytes, held_grad_bytes, optimizer_state_bytes, param_bytes
from switchyard.train.parallelize import apply_ddp, apply_fsdp
from switchyard.train.spec import JobSpec
from switchyard.train.strategy import Offload, Strategy


class TorchEngine:
    checkpoint_format = "dcp"

    def __init__(self, model: GPT, spec: JobSpec, *, device: torch.device, world_size: int, bf16: bool) -> None:
        """`model` may be on the meta device: it is then given storage only after sharding."""
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
            )
            if on_meta:
                # With CPU offload the shards live on the host; FSDP moves them per unit.
                materialize(model, torch.device("cpu") if par.offload is Offload.CPU else device, spec.seed)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=spec.optim.lr,
            betas=spec.optim.betas,
            weight_decay=spec.optim.weight_decay,
            foreach=False,  # same kernel for plain tensors and DTensors: identical numerics
        )
        self.probes: dict[str, RankMemory] = {}
        """Bytes held at points inside the first step, filled when `probe_memory` is set:
        SHARD_GRAD_OP only differs from FULL_SHARD between forward and backward."""
        self.probe_memory = False
        self.peak_grad_bytes = 0
        """With `probe_memory`: the most gradient bytes held after any micro-batch's backward."""

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
        dcp.save(self._state(), checkpoint_id=directory)

    def load(self, directory: Path) -> None:
        state = self._state()
        dcp.load(state, checkpoint_id=directory)
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
