"""FSDP2's root is not resharded after forward (issue 20): the embedding and head are what
backward needs first, so resharding them forced one exposed all-gather per step. Blocks are
resharded under FULL_SHARD (except the last), and nothing is under SHARD_GRAD_OP."""

from __future__ import annotations

import pytest
import torch

from switchyard.models import GPT
from switchyard.train.parallelize import apply_fsdp
from switchyard.train.strategy import Strategy
from tests.train._workers import tiny_spec


def _resharded(module: object) -> bool:
    group = module._get_fsdp_state()._fsdp_param_group  # type: ignore[attr-defined]
    return group.post_forward_mesh_info is not None  # FSDP2 keeps a mesh only to reshard to


@pytest.mark.parametrize("strategy", [Strategy.FSDP_FULL, Strategy.FSDP_GRAD_OP])
def test_the_root_is_never_resharded_after_forward(one_rank_group: None, strategy: Strategy) -> None:
    model = GPT(tiny_spec().model.gpt_config())
    apply_fsdp(model, strategy, world_size=1, device_type="cpu")
    model(torch.zeros(1, 8, dtype=torch.long))  # FSDP2 settles the root's rule at its first forward
    assert not _resharded(model)
    blocks = [_resharded(b) for b in model.blocks]
    if strategy is Strategy.FSDP_FULL:
        assert blocks == [True] * (len(blocks) - 1) + [False]
    else:
        assert not any(blocks)
