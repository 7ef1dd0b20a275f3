"""Print the planner's predictions against measurement, as the tables in docs/planner.md
("Predicted vs measured"): communication per GPU per step for every shipped strategy config
and activation memory for every checkpointing mode, for the tiny and small presets and one
shape drawn from the stated range.

    .venv/bin/python bench/plan_calibration.py [--seed N]

It runs what tests/plan/test_plan_calibration_{comm,activations}.py check (one 4-rank gloo
spawn, then single-process forward/backward passes) and takes about a minute on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "platform")]

from switchyard.train.strategy import CheckpointMode, Strategy  # noqa: E402
from tests.plan import _calibration_workers as workers  # noqa: E402
from tests.plan._calibration_shapes import (  # noqa: E402
    EVERY_K,
    MICRO_BATCH,
    SEQ_LEN,
    WORLD,
    CalibrationShape,
    calibration_shapes,
    calibration_spec,
    planned_activation_bytes,
    planned_comm_bytes,
)
from tests.plan._saved_activations import measure_peak  # noqa: E402


def comm_table(shapes: list[CalibrationShape]) -> list[str]:
    jobs = [(s, shape) for shape in shapes for s in Strategy]
    measured = workers.count_traffic([calibration_spec(s, shape) for s, shape in jobs], WORLD)
    rows = ["| strategy | model | predicted B | measured B | predicted / measured |", "|---|---|---:|---:|---:|"]
    for i, (strategy, shape) in enumerate(jobs):
        sent = workers.sent_per_rank(measured, i)
        mean = sum(sent) / len(sent)
        want = planned_comm_bytes(strategy, shape)
        rows.append(f"| {strategy.value} | {shape.name} | {want:,.0f} | {mean:,.0f} | {want / mean:.4f} |")
    return rows


def activation_table(shapes: list[CalibrationShape]) -> list[str]:
    rows = ["| checkpointing | model | predicted B | measured B | predicted / measured |", "|---|---|---:|---:|---:|"]
    for shape in shapes:
        config = shape.gpt_config()
        for mode in CheckpointMode:
            peak = measure_peak(config, mode, SEQ_LEN, MICRO_BATCH, EVERY_K).peak
            want = planned_activation_bytes(config, mode)
            rows.append(f"| {mode.value} | {shape.name} | {want:,.0f} | {peak:,} | {want / peak:.4f} |")
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seed", type=int, default=0, help="seed of the drawn shape (default 0)")
    args = parser.parse_args()
    shapes = calibration_shapes(args.seed)
    for shape in shapes:
        print(f"{shape.name}: {shape.preset} preset {shape.overrides or ''}".rstrip())
    print()
    print("\n".join(activation_table(shapes)))
    print()
    print("\n".join(comm_table(shapes)))


if __name__ == "__main__":
    main()
