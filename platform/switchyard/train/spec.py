"""The job spec researchers write: pydantic models loaded from YAML.

A bad file fails with the file, the line, the field and the reason (`JobSpecError`, read
through `switchyard.config_file`). The spec is
plain data; the trainer (`switchyard.train.loop`) and the Ray adapter read it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from switchyard.config_file import ConfigFileError, read_yaml, validate
from switchyard.models import GPTConfig
from switchyard.train.strategy import CheckpointMode, Offload, Strategy, WrapGranularity

MAX_PREEMPT_CHECK_S = 30.0
"""1/4 of the scheduler's default `preemption_grace_s` (120 s)."""


class JobSpecError(ConfigFileError):
    """A job spec that cannot be run; the message names the file, the line and the field."""


class _Spec(BaseModel):
    # No inf or NaN: `lr: .inf` trained to a NaN loss at step 1 (YAML reads `.inf` as a float).
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelSpec(_Spec):
    preset: str = "tiny"
    """A `GPTConfig.preset` name: tiny, small, medium, large, xl, 1b, 3b."""
    overrides: dict[str, Any] = Field(default_factory=dict)
    """Single `GPTConfig` fields replacing the preset's (e.g. `{max_seq_len: 64}`)."""

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.preset(self.preset, **self.overrides)

    @model_validator(mode="after")
    def _known_preset(self) -> ModelSpec:
        self.gpt_config()  # raises ValueError naming the preset or field
        return self


class DataSpec(_Spec):
    source: str = "synthetic"
    """`synthetic` (a generated corpus, no download), a local directory or file of uint16
    token shards (`*.bin`), or an `s3://bucket/prefix` of such shards."""
    synthetic_bytes: int = Field(default=200_000, ge=1024)
    """Size of the generated corpus when `source` is `synthetic`."""
    seq_len: int = Field(default=64, ge=2)
    micro_batch_size: int = Field(default=4, ge=1)
    """Sequences per rank per forward pass."""
    grad_accum_steps: int = Field(default=1, ge=1)
    """Micro-batches accumulated before each optimizer step."""


class ParallelSpec(_Spec):
    strategy: Strategy = Strategy.DDP
    offload: Offload = Offload.NONE
    wrap: WrapGranularity = WrapGranularity.BLOCK
    """FSDP unit: one per transformer block, one per linear layer, or only the root."""
    activation_checkpointing: CheckpointMode = CheckpointMode.NONE
    checkpoint_every_k: int = Field(default=2, ge=1)
    """For `every-k`: blocks 0, k, 2k, ... are recomputed in backward."""
    replicate_degree: int | None = Field(default=None, ge=1)
    """For `fsdp-hybrid`: number of replicas, each sharded over world/replicas ranks. Default:
    one shard group per node (shard within a node, replicate across nodes), the planner's
    rule too (`strategy.hybrid_layout`)."""
    precision: Literal["auto", "fp32", "bf16"] = "auto"
    """`auto` is bf16 on GPU and fp32 on CPU."""
    nvme_path: str | None = None
    """Local NVMe directory for `offload: nvme` (DeepSpeed ZeRO-Infinity)."""
    compile: bool = False
    """`torch.compile` each transformer block (after activation checkpointing, before
    sharding, as torchtitan does). DDP and fsdp-* only."""

    @model_validator(mode="after")
    def _offload_supported(self) -> ParallelSpec:
        if self.compile and self.strategy.is_deepspeed:
            raise ValueError(
                f"compile: not supported with strategy {self.strategy.value!r} (DeepSpeed's hooks on every "
                "submodule); use ddp or fsdp-*, or compile: false"
            )
        if self.compile and self.activation_checkpointing is CheckpointMode.SELECTIVE:
            # torch 2.13: the checkpointed attention core sits inside the compiled block, and its
            # recompute picks tensors of the wrong shapes (CheckpointError in backward).
            raise ValueError(
                "compile: not supported with activation_checkpointing 'selective' (the checkpointed "
                "attention core is inside the compiled block); use 'op', 'full', 'every-k' or 'none'"
            )
        if self.offload is Offload.NVME and self.strategy is not Strategy.ZERO3:
            raise ValueError(f"offload 'nvme' needs strategy 'zero3', not {self.strategy.value!r}")
        if self.offload is Offload.NVME and not self.nvme_path:
            raise ValueError("offload 'nvme' needs parallel.nvme_path")
        if self.offload is not Offload.NONE and self.strategy is Strategy.DDP:
            raise ValueError("strategy 'ddp' cannot offload; use fsdp-* (cpu) or zero* (cpu/nvme)")
        return self


class OptimSpec(_Spec):
    lr: float = Field(default=3e-3, gt=0)
    weight_decay: float = Field(default=0.0, ge=0)
    betas: tuple[float, float] = (0.9, 0.95)
    warmup_steps: int = Field(default=0, ge=0)
    grad_clip: float = Field(default=1.0, ge=0)
    """Max global gradient norm; 0 disables clipping."""


class CheckpointSpec(_Spec):
    uri: str | None = None
    """Checkpoint root: a local directory or `s3://bucket/prefix`; folders go under
    `<uri>/<job name>/step-N/`. Default: the state dir's `train/checkpoints`."""
    every_steps: int = Field(default=0, ge=0)
    """Save every N optimizer steps (0: only at the end and on preemption)."""
    save_final: bool = True
    keep: int = Field(default=3, ge=1)
    """Valid checkpoints to keep; older ones are deleted after a newer one is complete."""
    resume: bool = True
    """Resume from the latest valid checkpoint under `uri` if there is one."""


class ValidationSpec(_Spec):
    every_steps: int = Field(default=0, ge=0)
    """Validation loss every N optimizer steps and at the last one (0: never)."""
    sequences: int = Field(default=32, ge=1)
    """Sequences of `data.seq_len` tokens held back from training (drawn from the seed; training
    never reads them) and evaluated in full each time, split over the ranks. A multiple of
    `num_workers x data.micro_batch_size`, so every rank runs the same forwards."""


class JobSpec(_Spec):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9-]{0,62}$")
    """Job name: lowercase letters, digits and dashes; names the checkpoint folder."""
    steps: int = Field(ge=1)
    """Optimizer steps to train."""
    seed: int = 0
    num_workers: int = Field(default=2, ge=1)
    gpus_per_worker: int = Field(default=1, ge=1)
    """Must be 1: the trainer runs one data-parallel rank per GPU, so a worker holding more
    would lease GPUs it never uses. Ask for N GPUs with `num_workers: N`."""
    use_gpu: bool = False
    log_every_steps: int = Field(default=10, ge=1)
    """Log a metrics line (loss, lr, gradient norm, tokens/s, step time, MFU, memory) every N
    optimizer steps, and at the last step. The loss stays on the device in between: the
    host waits for the device only on these steps."""
    preempt_check_s: float = Field(default=5.0, ge=0)
    """Seconds between preemption checks (0: after every step). Must be at most 1/4 of the
    scheduler's preemption grace period (`preemption_grace_s`, 120 s by default), so a notice
    is seen with time left to checkpoint. Checkpoint steps are always checked."""
    peak_tflops_per_device: float | None = Field(default=None, gt=0)
    """Dense peak TFLOP/s of one device at the job's precision (e.g. 989 for H100 SXM bf16),
    for MFU. Without it MFU is reported as null: the platform does not guess a peak."""
    init_from: str | None = None
    """A checkpoint directory (local or s3://) whose model weights start this job: a
    fine-tune from a base model. Distinct from resuming this job's own checkpoints, which
    wins when both exist."""
    model: ModelSpec = Field(default_factory=ModelSpec)
    data: DataSpec = Field(default_factory=DataSpec)
    parallel: ParallelSpec = Field(default_factory=ParallelSpec)
    optim: OptimSpec = Field(default_factory=OptimSpec)
    checkpoint: CheckpointSpec = Field(default_factory=CheckpointSpec)
    validation: ValidationSpec = Field(default_factory=ValidationSpec)

    @model_validator(mode="before")
    @classmethod
    def _renamed_fields(cls, data: Any) -> Any:
        if isinstance(data, dict) and "log_every" in data:
            raise ValueError("log_every was renamed log_every_steps (default 10)")
        return data

    @field_validator("preempt_check_s")
    @classmethod
    def _within_grace(cls, value: float) -> float:
        if value > MAX_PREEMPT_CHECK_S:
            raise ValueError(
                f"must be at most {MAX_PREEMPT_CHECK_S:g} s (1/4 of the scheduler's default preemption "
                f"grace period of 120 s), got {value:g}: a notice must be seen with time left to checkpoint"
            )
        return value

    @field_validator("gpus_per_worker")
    @classmethod
    def _one_gpu_per_worker(cls, value: int) -> int:
        if value != 1:
            raise ValueError(
                f"must be 1, got {value}: the trainer runs one data-parallel rank per GPU, so a worker would "
                f"lease {value - 1} GPU(s) it never uses; ask for N GPUs with num_workers: N instead"
            )
        return value

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        max_len = self.model.gpt_config().max_seq_len
        if self.data.seq_len > max_len:
            raise ValueError(f"data.seq_len {self.data.seq_len} exceeds model max_seq_len {max_len}")
        replicas = self.parallel.replicate_degree
        hybrid = self.parallel.strategy is Strategy.FSDP_HYBRID
        if hybrid and replicas is not None and (self.num_workers % replicas or self.num_workers == replicas):
            raise ValueError(
                f"fsdp-hybrid needs num_workers ({self.num_workers}) to be a multiple of "
                f"parallel.replicate_degree ({replicas}) with shard groups larger than one"
            )
        per_pass = self.num_workers * self.data.micro_batch_size
        if self.validation.every_steps and self.validation.sequences % per_pass:
            raise ValueError(
                f"validation.sequences ({self.validation.sequences}) must be a multiple of num_workers x "
                f"data.micro_batch_size ({per_pass}), so every rank runs the same forwards"
            )
        return self

    @property
    def gpus(self) -> int:
        """The GPUs the job asks the scheduler for."""
        return self.num_workers * self.gpus_per_worker

    def with_changes(self, **changes: Any) -> JobSpec:
        """A copy with top-level or dotted fields replaced (`{"parallel.strategy": "zero2"}`)."""
        data = self.model_dump(mode="json")
        for key, value in changes.items():
            target = data
            *parents, leaf = key.split(".")
            for part in parents:
                target = target[part]
            target[leaf] = value
        return JobSpec.model_validate(data)


def load_job_spec(path: str | Path) -> JobSpec:
    """Read and validate a YAML job spec; errors name the file, the line and the field."""
    return validate(read_yaml(path, error=JobSpecError), JobSpec, error=JobSpecError)
