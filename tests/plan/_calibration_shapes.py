"""What the planner is calibrated on, and what it predicts for it: two presets and one shape
drawn from a stated range, by a seed that every failure message names (set
PLAN_CALIBRATION_SEED to replay it); the shipped strategy configs at that size."""

from __future__ import annotations

import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.models import GPTConfig
from switchyard.train.plan import ClusterSpec, Precision, TrainingJob, plan
from switchyard.train.plan.from_spec import spec_input
from switchyard.train.plan.presets import shape_from_gpt_config
from switchyard.train.spec import JobSpec, load_job_spec
from switchyard.train.strategy import CheckpointMode, Strategy

SEED_VARIABLE = "PLAN_CALIBRATION_SEED"
CONFIGS = Path(__file__).resolve().parents[2] / "train_jobs" / "configs"
SEQ_LEN, MICRO_BATCH, EVERY_K = 64, 2, 2
"""The activation measurement's batch (2 x 64 tokens) and every-k's k."""
WORLD = 4
"""Ranks the communication is measured on: the shipped fsdp-hybrid config is 2 replicas of
2-rank shard groups, and a 2-rank hybrid job (shard groups of one) is refused by the spec."""
PRESETS = ("tiny", "small")
DRAWN_RANGE = {
    "n_layer": (1, 4),
    "n_head": (1, 4),
    "head_dim": (8, 48),
    "mlp_ratio": (1, 4),
    "vocab_size": (257, 1024),
}
"""Inclusive ranges; head_dim is drawn in steps of 8, tie_embeddings is a coin flip. With
d_model up to 192 and vocab up to 1024 some matrices pass ZeRO-3's 1e5-element persistence
threshold and some do not."""


@dataclass(frozen=True)
class CalibrationShape:
    label: str
    preset: str
    overrides: dict[str, Any]

    def model_spec(self) -> dict[str, Any]:
        return {"model.preset": self.preset, "model.overrides": self.overrides}

    def gpt_config(self) -> GPTConfig:
        return GPTConfig.preset(self.preset, **self.overrides)

    @property
    def name(self) -> str:
        return self.label.split()[0]


def calibration_seed() -> int:
    value = os.environ.get(SEED_VARIABLE)
    return int(value) if value else random.SystemRandom().randrange(2**32)


def drawn_shape(seed: int) -> CalibrationShape:
    rng = random.Random(seed)
    low, high = DRAWN_RANGE["head_dim"]
    heads = rng.randint(*DRAWN_RANGE["n_head"])
    overrides = {
        "n_layer": rng.randint(*DRAWN_RANGE["n_layer"]),
        "n_head": heads,
        "d_model": heads * 8 * rng.randint(low // 8, high // 8),
        "mlp_ratio": rng.randint(*DRAWN_RANGE["mlp_ratio"]),
        "vocab_size": rng.randint(*DRAWN_RANGE["vocab_size"]),
        "tie_embeddings": rng.random() < 0.5,
    }
    return CalibrationShape(f"drawn (seed {seed}: {SEED_VARIABLE}={seed})", "tiny", overrides)


def calibration_shapes(seed: int) -> list[CalibrationShape]:
    return [*(CalibrationShape(p, p, {}) for p in PRESETS), drawn_shape(seed)]


def calibration_spec(strategy: Strategy, shape: CalibrationShape) -> JobSpec:
    """The shipped config for `strategy` at the calibration's size: WORLD ranks, 2
    micro-batches of 2 x 32 tokens per step, the given model; the rest as shipped
    (activation checkpointing, wrap, replicate degree)."""
    changes = {
        "num_workers": WORLD,
        "data.grad_accum_steps": 2,
        "data.seq_len": 32,
        "data.micro_batch_size": 2,
        **shape.model_spec(),
    }
    return load_job_spec(CONFIGS / f"{strategy.value}.yaml").with_changes(**changes)


def planned_comm_bytes(strategy: Strategy, shape: CalibrationShape) -> float:
    job = spec_input(calibration_spec(strategy, shape))
    return plan(job.shape, ClusterSpec(gpus=job.gpus), job.job).comm.bytes_per_gpu


def planned_activation_bytes(config: GPTConfig, mode: CheckpointMode) -> float:
    """fp32 (the CPU default) with flash attention: SDPA picks its CPU flash kernel for causal
    fp32 attention without dropout, and the measurement checks that it did."""
    job = TrainingJob(
        strategy=Strategy.DDP,
        precision=Precision.FP32,
        seq_len=SEQ_LEN,
        micro_batch=MICRO_BATCH,
        checkpointing=mode,
        checkpoint_every_k=EVERY_K,
        flash_attention=True,
    )
    total = plan(shape_from_gpt_config(config), ClusterSpec(gpus=1), job).activation_total
    if total is None:
        raise AssertionError("a plan with a model shape has activations")
    return total.value
