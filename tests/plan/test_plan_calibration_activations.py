"""The planner's activation memory against what a real forward and backward keep.

The switchyard GPT with the trainer's activation checkpointing
(`switchyard.train.activation.apply_activation_checkpointing`) in every mode, fp32 on the
CPU, 2 sequences of 64 tokens, for the tiny and small presets and one shape drawn from
`_calibration_shapes.DRAWN_RANGE`. Measured: the peak over forward and backward of the
bytes held for backward (`_saved_activations`); planned: `plan(...).activation_total`,
within 10%. Attention runs PyTorch's CPU flash kernel
(`_scaled_dot_product_flash_attention_for_cpu`, which SDPA picks for causal fp32 attention
without dropout), so the plan is made with `flash_attention=True`; the test fails if
another kernel ran.
"""

from __future__ import annotations

import pytest
import torch

from switchyard.models import GPT, next_token_loss
from switchyard.train.strategy import CheckpointMode
from tests.plan._calibration_shapes import (
    EVERY_K,
    MICRO_BATCH,
    SEQ_LEN,
    CalibrationShape,
    calibration_seed,
    calibration_shapes,
    planned_activation_bytes,
)
from tests.plan._saved_activations import FLASH_KERNEL, LiveActivations, SavedTensors, measure_peak, parameter_storages

TOLERANCE = 0.10
SHAPES = calibration_shapes(calibration_seed())
CASES = [(shape, mode) for shape in SHAPES for mode in CheckpointMode]


@pytest.mark.parametrize(("shape", "mode"), CASES, ids=[f"{s.name}-{m.value}" for s, m in CASES])
def test_planned_activations_match_the_measured_peak(shape: CalibrationShape, mode: CheckpointMode) -> None:
    config = shape.gpt_config()
    meter = measure_peak(config, mode, SEQ_LEN, MICRO_BATCH, EVERY_K)
    assert FLASH_KERNEL in meter.kernels, sorted(k for k in meter.kernels if "attention" in k)
    want = planned_activation_bytes(config, mode)
    assert meter.peak == pytest.approx(want, rel=TOLERANCE), (
        f"{mode.value}, {shape.label} {shape.overrides}: measured peak {meter.peak} B, planned {want:.0f} B, "
        f"ratio {want / meter.peak:.3f}"
    )


def test_what_stays_alive_after_forward_is_what_autograd_saved() -> None:
    # Without checkpointing the hooks see every saved tensor: the storages the liveness
    # counter still holds at the end of forward must be exactly those, plus the loss.
    torch.manual_seed(0)
    model = GPT(SHAPES[1].gpt_config())
    tokens = torch.randint(0, 256, (MICRO_BATCH, SEQ_LEN + 1))
    x, y = tokens[:, :-1], tokens[:, 1:]
    excluded = parameter_storages(model) | {t.untyped_storage().data_ptr() for t in (x, y)}
    saved, live = SavedTensors(excluded), LiveActivations(excluded)
    with saved, live:
        loss = next_token_loss(model(x), y)
        alive = live.alive_keys() - {loss.untyped_storage().data_ptr()}
    assert alive == set(saved.saved)
    assert sum(saved.saved.values()) > 0.9 * planned_activation_bytes(model.config, CheckpointMode.NONE)
