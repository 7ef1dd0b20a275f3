"""The planner's communication against bytes counted in real optimizer steps.

Every shipped strategy config (`train_jobs/configs/<strategy>.yaml`), built and stepped by the
trainer's own code on 4 gloo ranks, fp32 (the CPU default), 2 micro-batches per step so that
accumulation traffic is in the count, for the tiny and small presets and one shape drawn
from `_calibration_shapes.DRAWN_RANGE`. Each rank's collectives are counted by
`tests/_collectives.CollectiveCounter` (ring bytes per call); the mean over ranks of one
steady-state step must be within 10% of `plan(...).comm.bytes_per_gpu`.

4 ranks, not 2 (`_calibration_shapes.WORLD`): the shipped fsdp-hybrid config needs shard
groups of more than one rank. One spawn runs every job.
"""

from __future__ import annotations

import pytest

from switchyard.train.strategy import Strategy
from tests.plan import _calibration_workers as workers
from tests.plan._calibration_shapes import (
    WORLD,
    CalibrationShape,
    calibration_seed,
    calibration_shapes,
    calibration_spec,
    planned_comm_bytes,
)

pytestmark = pytest.mark.slow
TOLERANCE = 0.10
SHAPES = calibration_shapes(calibration_seed())
JOBS = [(strategy, shape) for shape in SHAPES for strategy in Strategy]


@pytest.fixture(scope="module")
def measured() -> workers.Measured:
    return workers.count_traffic([calibration_spec(s, shape) for s, shape in JOBS], WORLD)


@pytest.mark.parametrize(("strategy", "shape"), JOBS, ids=[f"{s.value}-{c.name}" for s, c in JOBS])
def test_planned_bytes_per_step_match_the_counted_bytes(
    measured: workers.Measured, strategy: Strategy, shape: CalibrationShape
) -> None:
    sent = workers.sent_per_rank(measured, JOBS.index((strategy, shape)))
    mean = sum(sent) / len(sent)
    want = planned_comm_bytes(strategy, shape)
    assert mean == pytest.approx(want, rel=TOLERANCE), (
        f"{strategy.value}, {shape.label} {shape.overrides}: counted {mean:.0f} B per rank per step "
        f"(ranks: {sent}), planned {want:.0f} B, ratio {want / mean:.3f}"
    )


def test_accumulation_repeats_what_the_trainer_repeats(measured: workers.Measured) -> None:
    # Guards the comparison above against a count that misses the accumulation: with 2
    # micro-batches ZeRO-2 reduces the gradients twice, ZeRO-1 once.
    tiny = SHAPES[0]

    def reduced(strategy: Strategy) -> int:
        calls = measured[0][JOBS.index((strategy, tiny))][workers.STEPS - 1]
        return sum(c["bytes"] for c in calls if c["op"] == "reduce")

    assert reduced(Strategy.ZERO2) == 2 * reduced(Strategy.ZERO1) > 0
