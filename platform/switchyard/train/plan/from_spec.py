"""Read a trainer job spec (`switchyard.train.spec.JobSpec`) as a planner input, so a
researcher plans exactly the file they will submit.

Kept out of the package's `__init__`: the spec imports `switchyard.models`, hence torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from switchyard.train.plan.errors import PlanError
from switchyard.train.plan.job import OptimizerKind, Precision, TrainingJob
from switchyard.train.plan.presets import shape_from_gpt_config
from switchyard.train.plan.shape import ModelShape
from switchyard.train.spec import JobSpec, JobSpecError, load_job_spec
from switchyard.train.strategy import Strategy


@dataclass(frozen=True)
class SpecInput:
    shape: ModelShape
    gpus: int
    job: TrainingJob


def spec_input(spec: JobSpec) -> SpecInput:
    par, data = spec.parallel, spec.data
    # The spec's `auto` is bf16 on GPU and fp32 on CPU (the trainer's rule).
    precision = (
        Precision(par.precision) if par.precision != "auto" else (Precision.BF16 if spec.use_gpu else Precision.FP32)
    )
    # fsdp-hybrid: a shard group per node unless replicate_degree says otherwise, the trainer's
    # rule (`strategy.hybrid_layout`), which the planner's default (None) already is.
    shard_group = None
    if par.strategy is Strategy.FSDP_HYBRID and par.replicate_degree:
        shard_group = spec.num_workers // par.replicate_degree
    job = TrainingJob(
        strategy=par.strategy,
        precision=precision,
        optimizer=OptimizerKind.ADAMW,  # both engines build torch.optim.AdamW
        offload=par.offload,
        micro_batch=data.micro_batch_size,
        seq_len=data.seq_len,
        grad_accum=data.grad_accum_steps,
        checkpointing=par.activation_checkpointing,
        checkpoint_every_k=par.checkpoint_every_k,
        wrap=par.wrap,
        shard_group=shard_group,
    )
    return SpecInput(shape_from_gpt_config(spec.model.gpt_config()), spec.num_workers, job)


def load_spec_input(path: str | Path) -> SpecInput:
    try:
        return spec_input(load_job_spec(path))
    except JobSpecError as exc:
        raise PlanError(str(exc)) from None
