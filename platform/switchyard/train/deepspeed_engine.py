"""DeepSpeed ZeRO 1/2/3: the trainer's DeepSpeed config, and the engine that runs it.

The config sets what DeepSpeed leaves at defaults the trainer does not want
(`docs/training.md`, "DeepSpeed: what each stage sends"): gradients reduced to the rank that
owns them (the bytes of a reduce-scatter, not an all-reduce) and overlapped with backward,
and gradients reduced and (stages 2/3) accumulated in fp32, as FSDP does. The optimizer is a
torch AdamW, or DeepSpeed's CPU Adam for offload when its op is already built; nothing is
compiled here.
"""

from __future__ import annotations

import logging
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

log = logging.getLogger(__name__)

_STAGE = {Strategy.ZERO1: 1, Strategy.ZERO2: 2, Strategy.ZERO3: 3}
_TAG = "zero"  # one tag per checkpoint folder: the folder name already carries the step
REDUCE_BUCKET_ELEMENTS = 500_000_000
"""DeepSpeed's default `reduce_bucket_size`; the trainer caps it at the model's size."""


def zero_optimization(spec: JobSpec) -> dict[str, Any]:
    """The `zero_optimization` section: stage, gradient reduction and offload."""
    par = spec.parallel
    zero: dict[str, Any] = {
        "stage": _STAGE[par.strategy],
        # Stages 1/2: reduce each gradient slice to the rank that owns it, one `reduce` per
        # owner: (N-1)/N of the gradients per rank, a reduce-scatter's bytes. DeepSpeed's
        # default (`use_multi_rank_bucket_allreduce: true`) all-reduces the bucket: twice that.
        # Stage 3 reduce-scatters either way.
        "reduce_scatter": True,
        "use_multi_rank_bucket_allreduce": False,
        "contiguous_gradients": True,
        # Reduce a bucket while backward fills the next (DeepSpeed's default: stage 3 only).
        # It costs a second bucket buffer; on CPU DeepSpeed has no streams, so nothing overlaps.
        "overlap_comm": True,
        # DeepSpeed allocates whole buckets up front: none larger than all the gradients.
        "reduce_bucket_size": min(REDUCE_BUCKET_ELEMENTS, spec.model.gpt_config().num_parameters()),
    }
    if par.offload is not Offload.NONE:
        target: dict[str, Any] = {"device": par.offload.value}
        if par.offload is Offload.NVME:
            target["nvme_path"] = par.nvme_path
        zero["offload_optimizer"] = target
        if par.strategy is Strategy.ZERO3:
            zero["offload_param"] = dict(target)
    return zero


def grad_accum_dtype(strategy: Strategy, *, bf16: bool) -> str:
    """fp32, except bf16 ZeRO-1: DeepSpeed runs bf16 ZeRO-1 with fp32 accumulation through its
    BF16_Optimizer instead, which keeps whole fp32 gradients (4Ψ per rank) and all-reduces them."""
    return "bf16" if bf16 and strategy is Strategy.ZERO1 else "fp32"


def deepspeed_config(spec: JobSpec, *, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed JSON config for a job spec."""
    return {
        "train_micro_batch_size_per_gpu": spec.data.micro_batch_size,
        "gradient_accumulation_steps": spec.data.grad_accum_steps,
        "gradient_clipping": spec.optim.grad_clip,
        # A torch optimizer (or an already built CPU Adam) instead of DeepSpeed's
        # FusedAdam/CPUAdam built on demand: nothing to compile.
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "zero_optimization": zero_optimization(spec),
        "bf16": {"enabled": bf16},
        # Gradients are summed over ranks in fp32 whatever the compute dtype, as FSDP's
        # reduce_dtype: twice the bytes of a bf16 reduction, none of its rounding per hop.
        "communication_data_type": "fp32",
        "data_types": {"grad_accum_dtype": grad_accum_dtype(spec.parallel.strategy, bf16=bf16)},
        "steps_per_print": 2**31 - 1,
    }


def cpu_adam_unavailable() -> str | None:
    """Why DeepSpeed's CPU Adam cannot be used without compiling its op now (minutes, on every
    rank), or None when the op is ready: built into the install (`DS_BUILD_CPU_ADAM=1`) or by
    a setup step into torch's extensions directory (`CPUAdamBuilder().load()` run once)."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops
    from torch.utils.cpp_extension import _get_build_directory  # where DeepSpeed's JIT build goes

    if installed_ops.get("cpu_adam") and accelerator_name == get_accelerator()._name:
        return None
    built = Path(_get_build_directory("cpu_adam", verbose=False)) / "cpu_adam.so"
    if built.is_file():
        return None
    return (
        f"DeepSpeed's cpu_adam op is not built (not in the install, no {built}); build it at setup with "
        "DS_BUILD_CPU_ADAM=1 pip install deepspeed, or run "
        "deepspeed.ops.op_builder.CPUAdamBuilder().load() once"
    )


def build_optimizer(model: nn.Module, spec: JobSpec) -> torch.optim.Optimizer:
    """AdamW for DeepSpeed to wrap: DeepSpeed's vectorised CPU Adam when the optimizer state is
    offloaded and its op is built; otherwise torch's, with a warning when offloading."""
    o = spec.optim
    if spec.parallel.offload is not Offload.NONE:
        missing = cpu_adam_unavailable()
        if missing is None:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            return DeepSpeedCPUAdam(
                model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, adamw_mode=True
            )
        log.warning(
            "offload %s: %s; the optimizer steps a torch.optim.AdamW on the CPU instead, several times slower",
            spec.parallel.offload.value,
            missing,
        )
    return torch.optim.AdamW(model.parameters(), lr=o.lr, betas=o.betas, weight_decay=o.weight_decay, foreach=False)


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
        self.engine, _, _, _ = deepspeed.initialize(
            model=model,
            optimizer=build_optimizer(model, spec),
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

    def evaluate(self, batches: list[Batch]) -> Tensor:
        self.engine.eval()
        total = torch.zeros((), device=self.device)
        try:
            for x, y in batches:  # ZeRO-3 gathers each module's parameters as in training
                with torch.no_grad():
                    total += next_token_loss(self.engine(x), y) * y.numel()
        finally:
            self.engine.train()
        return total

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

    def checkpoint_files(self, names: list[str]) -> set[str]:
        """The files `load` opens on this rank: the tag folder less the other ranks'
        `[bf16_]zero_pp_rank_<r>_*` partitions (DeepSpeed reads only its own unless
        `elastic_checkpoint`, which the config never sets)."""

        def partition_rank(filename: str) -> str | None:
            head = filename.removeprefix("bf16_")
            return head.removeprefix("zero_pp_rank_").split("_", 1)[0] if head.startswith("zero_pp_rank_") else None

        own = str(self.engine.global_rank)
        return {n for n in names if n.startswith(f"{_TAG}/") and partition_rank(Path(n).name) in (None, own)}

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
