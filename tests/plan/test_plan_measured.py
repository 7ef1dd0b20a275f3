"""The planner against bytes measured on real ranks: the tiny switchyard GPT, sharded as the
trainer shards it (DDP and FSDP2 `fully_shard`) on a 2-rank gloo group, one AdamW step in
fp32. Per-rank parameter, gradient and optimizer-state bytes must be within 5% of the plan.

All strategies run in one spawned process group, so the test pays for one spawn.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from switchyard.train.plan import ClusterSpec, Precision, TrainingJob, model_preset, plan
from switchyard.train.strategy import Strategy
from tests.plan import _plan_workers as workers

WORLD = 2
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("measured")
    torch.multiprocessing.spawn(
        workers.measure_strategies,
        args=(WORLD, str(out / "init"), str(out)),
        nprocs=WORLD,
        join=True,
    )
    return [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.parametrize("strategy", [s.value for s in workers.STRATEGIES])
def test_per_rank_bytes_match_the_plan(measured: list[dict[str, Any]], strategy: str) -> None:
    job = TrainingJob(strategy=Strategy(strategy), precision=Precision.FP32, seq_len=32)
    predicted = plan(model_preset(f"gpt-{workers.PRESET}"), ClusterSpec(gpus=WORLD), job)
    expected = {
        "parameters": predicted.states.parameters.value,
        "gradients": predicted.states.gradients.value,
        "optimizer": predicted.states.optimizer.value,
    }
    for rank, per_rank in enumerate(measured):
        got = per_rank[strategy]
        for name, want in expected.items():
            assert got[name] == pytest.approx(want, rel=TOLERANCE), (
                f"{strategy} rank {rank} {name}: measured {got[name]} B, planned {want:.0f} B"
            )


def test_sharding_is_visible_in_the_measurement(measured: list[dict[str, Any]]) -> None:
    # Guards the comparison above against a run that silently did not shard.
    rank0 = measured[0]
    assert rank0["fsdp-full"]["parameters"] < 0.55 * rank0["ddp"]["parameters"]
    assert rank0["fsdp-no-shard"]["parameters"] == rank0["ddp"]["parameters"]
