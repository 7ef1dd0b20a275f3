"""DeepSpeed ZeRO 1/2/3 with a plain torch AdamW (no DeepSpeed op to compile)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from switchyard.models import GPT, GPTConfig, next_token_loss
from switchyard.train.engine import Batch, StepOutput
from switchyard.train.materialize import (
    init_partitioned_weights,
    is_meta,
    materialize,
    partitioned_construction,
)
from switchyard.train.memory import RankMemory, grad_bytes, optimizer_state_bytes, param_bytes
from switchyard.train.spec import JobSpec
from switchyard.train.strategy import Offload, Strategy

_STAGE = {Strategy.ZERO1: 1, Strategy.ZERO2: 2, Strategy.ZERO3: 3}
_TAG = "zero"  # one tag per checkpoint folder: the folder name already carries the step


def deepspeed_config(spec: JobSpec, *, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed JSON config for a job spec."""
    par = spec.parallel
    zero: dict[str, Any] = {"stage": _STAGE[par.strategy]}
    if par.offload is not Offload.NONE:
        target: dict[str, Any] = {"device": par.offload.value}
        if par.offload is Offload.NVME:
            target["nvme_path"] = par.nvme_path
        zero["offload_optimizer"] = target
        if par.strategy is Strategy.ZERO3:
            zero["offload_param"] = dict(target)
    return {
        "train_micro_batch_size_per_gpu": spec.data.micro_batch_size,
        "gradient_accumulation_steps": spec.data.grad_accum_steps,
        "gradient_clipping": spec.optim.grad_clip,
        # A torch optimizer instead of DeepSpeed's FusedAdam/CPUAdam: nothing to compile.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16},
        "steps_per_print": 2**31 - 1,
    }


def is_partitioned(model: nn.Module) -> bool:
    """Built under `deepspeed.zero.Init`: every parameter already holds only its partition."""
    return all(hasattr(p, "ds_tensor") for p in model.parameters())


def partitioned_model(config: GPTConfig, spec: JobSpec, *, bf16: bool) -> GPT:
    """ZeRO-3: construct the model partitioned from the start (no rank ever holds it all)."""
    with partitioned_construction(deepspeed_config(spec, bf16=bf16)):
        return GPT(config)


class DeepSpeedEngine:
    checkpoint_format = "deepspeed"

    def __init__(self, model: GPT, spec: JobSpec, *, device: torch.device, world_size: int, bf16: bool) -> None:
        import deepspeed  # imported here: 2-4 s, and only ZeRO jobs need it

        if not spec.parallel.strategy.is_deepspeed:
            raise ValueError(f"DeepSpeedEngine got strategy {spec.parallel.strategy.value!r}")
        if is_partitioned(model):
            init_partitioned_weights(model, spec.seed)  # built under zero.Init (ZeRO-3)
        elif is_meta(model):
            materialize(model, device, spec.seed)  # ZeRO-1/2 replicate the parameters anyway
        else:
            model.to(device)
        optimizer = torch.optim.AdamW(
            model.parameters(),
            lr=spec.optim.lr,
            betas=spec.optim.betas,
            weight_decay=spec.optim.weight_decay,
            foreach=False,
        )
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=optimizer,
            config=deepspeed_config(spec, bf16=bf16),
            dist_init_required=False,
        )
        self.model: nn.Module = self.engine
        self.device = device
        self.bf16 = bf16

    def train_step(self, micro_batches: list[Batch], lr: float) -> StepOutput:
        for group in self.engine.optimizer.param_groups:
            group["lr"] = lr
        total = torch.zeros((), device=self.device)
        for x, y in micro_batches:
            loss = next_token_loss(self.engine(x), y)
            self.engine.backward(loss)  # scales by 1/gradient_accumulation_steps itself
            self.engine.step()  # steps the optimizer only at the accumulation boundary
            total += loss.detach().float()
        return StepOutput(total / len(micro_batches), self._grad_norm())

    def _grad_norm(self) -> Tensor | None:
        """DeepSpeed's norm of the last optimizer step, before clipping (a device tensor, a
        float, or None when ZeRO's norm computation is off)."""
        norm = self.engine.get_global_grad_norm()
        return None if norm is None else torch.as_tensor(norm, dtype=torch.float32, device=self.device)

    def save(self, directory: Path) -> None:
        self.engine.save_checkpoint(str(directory), tag=_TAG, save_latest=False)

    def load(self, directory: Path) -> None:
        path, _ = self.engine.load_checkpoint(
            str(directory), tag=_TAG, load_optimizer_states=True, load_lr_scheduler_states=False
        )
        if path is None:
            raise RuntimeError(f"DeepSpeed found no checkpoint tag {_TAG!r} in {directory}")

    def memory(self) -> RankMemory:
        params = list(self.engine.module.parameters())
        inner = getattr(self.engine.optimizer, "optimizer", self.engine.optimizer)
        return RankMemory(
            params=param_bytes(params),
            grads=grad_bytes(params),
            optimizer_state=optimizer_state_bytes(inner),
        )


def load_deepspeed_weights(model: nn.Module, directory: Path) -> None:
    """Full fp32 weights from a ZeRO checkpoint into a plain model (for `init_from`)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(directory), tag=_TAG)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # The tied head weight is saved once, under the embedding's name.
    missing = [k for k in missing if k != "head.weight"]
    if missing or unexpected:
        raise ValueError(f"{directory}: weights do not fit the model: missing {missing}, unexpected {unexpected}")
