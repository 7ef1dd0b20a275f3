"""Meta-device construction: no rank holds the whole model while it is built and sharded,
and the weights are those of a whole model with the same (shard-reproducible) initialisation.

Peak bytes are tensor storage counted from the profiler's allocator events, not RSS."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import _workers
import pytest
import torch
from _workers import meta_spec

from switchyard.models import GPT
from switchyard.train.launch import spawn_group
from switchyard.train.materialize import init_sharded_weights, materialize, meta_model

CONFIG = meta_spec("fsdp-full").model.gpt_config()
MODEL_BYTES = CONFIG.num_parameters() * 4
BLOCK_BYTES = sum(p.numel() for p in GPT(CONFIG).blocks[0].parameters()) * 4


def _construct(strategies: list[str], nproc: int = 2) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        spawn_group(_workers.construct_on_meta, nproc, strategies, str(out), finished=out.is_file)
        result: dict[str, Any] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def built() -> dict[str, Any]:
    return _construct(["fsdp-full", "fsdp-grad-op", "ddp"])


@pytest.mark.parametrize("strategy", ["fsdp-full", "fsdp-grad-op", "ddp"])
def test_meta_built_model_trains_like_the_whole_one(built: dict[str, Any], strategy: str) -> None:
    assert built[strategy]["meta"] == built[strategy]["whole"]  # bit for bit


def test_sharded_construction_peaks_at_a_shard_plus_one_block(built: dict[str, Any]) -> None:
    bound = MODEL_BYTES / 2 + BLOCK_BYTES
    for strategy in ("fsdp-full", "fsdp-grad-op"):
        for meta_peak, whole_peak, held in built[strategy]["peaks"]:
            assert held == 0  # nothing but shapes before sharding
            assert meta_peak <= bound, (strategy, meta_peak, bound)
            # The meter sees the difference: whole construction holds the model and its shards.
            assert whole_peak > MODEL_BYTES


def test_initialisation_depends_on_seed_and_name_only() -> None:
    whole = GPT(CONFIG)
    init_sharded_weights(whole, seed=5)
    again = meta_model(CONFIG)
    materialize(again, torch.device("cpu"), seed=5)
    for (name, a), b in zip(whole.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert again.head.weight is again.tok_emb.weight  # still tied after to_empty
    other = GPT(CONFIG)
    init_sharded_weights(other, seed=6)
    assert not torch.equal(other.blocks[0].mlp.up.weight, whole.blocks[0].mlp.up.weight)


@pytest.mark.slow
def test_zero3_is_built_partitioned_and_trains_like_the_whole_model() -> None:
    built = _construct(["zero3"])["zero3"]
    assert built["meta"] == built["whole"]
    for _, _, held in built["peaks"]:
        # Before deepspeed.initialize each rank holds only its partition (ds_tensor).
        assert abs(held - MODEL_BYTES / 2) <= 0.01 * MODEL_BYTES
