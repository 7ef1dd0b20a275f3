"""Activation memory against Korthikanti et al. 2022, with the arithmetic by hand."""

from __future__ import annotations

import pytest

from switchyard.train.plan import ClusterSpec, TrainingJob, model_preset, plan
from switchyard.train.plan.activations import (
    activations,
    checkpointed_blocks,
    layer_activations,
    outside_blocks,
)
from switchyard.train.strategy import CheckpointMode

GPT3 = model_preset("gpt3-175b")
S, B, H, A = 2048, 1, 12288, 96
SBH = S * B * H  # 25,165,824


def test_gpt3_layer_is_the_papers_34sbh_plus_5as2b() -> None:
    # sbh·(34 + 5·a·s/h) = 25,165,824·(34 + 5·96·2048/12288) = 25,165,824·(34 + 80)
    #                    = 2,868,903,936 bytes per layer (16-bit, dropout, no flash)
    layer = layer_activations(GPT3, S, B, e=2, flash=False)
    assert layer.full == 2_868_903_936
    assert layer.dense == 34 * SBH  # selective recompute keeps 34·sbh = 855,638,016
    assert layer.scores == 5 * A * S * S * B  # 5·as²b = 2,013,265,920


def test_checkpointing_modes_on_gpt3() -> None:
    full_layer, L = 2_868_903_936, 96
    def blocks(mode: CheckpointMode, k: int = 2) -> tuple[float, float]:
        a = activations(GPT3, S, B, 2, False, mode, k)
        return a.blocks.value, a.recompute.value
    assert blocks(CheckpointMode.NONE) == (L * full_layer, 0)  # 275,414,777,856
    # selective: the attention core of the top block recomputes on top of 95 blocks' 34·sbh
    assert blocks(CheckpointMode.SELECTIVE) == (L * 34 * SBH, (L - 1) * 34 * SBH + full_layer)
    # full: 2·sbh per block input at the end of forward (4,831,838,208); in backward the top
    # block recomputes while the 95 below it still hold their inputs
    assert blocks(CheckpointMode.FULL) == (L * 2 * SBH, (L - 1) * 2 * SBH + full_layer)
    # every-k with k = 4: blocks[::4] = 24 checkpointed, 72 kept. The top checkpointed block
    # is 92: below it 23 checkpointed and 69 kept blocks, then it recomputes.
    assert checkpointed_blocks(L, CheckpointMode.EVERY_K, 4) == 24
    assert blocks(CheckpointMode.EVERY_K, 4) == (
        24 * 2 * SBH + 72 * full_layer,
        23 * 2 * SBH + 69 * full_layer + full_layer,
    )


def test_flash_attention_drops_the_s_squared_term() -> None:
    # flash keeps fp32 log-sum-exp rows, 4·a·s·b = 4·96·2048 = 786,432 bytes
    layer = layer_activations(GPT3, S, B, e=2, flash=True)
    assert layer.full == 34 * SBH + 786_432


def test_llama3_8b_gqa_swiglu_layer() -> None:
    # s = 8192, b = 1, h = 4096, kv = 8·128 = 1024, f = 14336, a = 32, bf16, flash, no dropout
    # attention  2·(3h + 2kv) = 2·(12288 + 2048)   = 28,672 per token
    # MLP        2·h + 4·2·f  = 8192 + 114,688     = 122,880
    # norms      2·2·h                             = 16,384
    # per token 167,936 · 8192 tokens = 1,375,731,712; + 4·32·8192 = 1,048,576 (LSE)
    layer = layer_activations(model_preset("llama3-8b"), 8192, 1, e=2, flash=True)
    assert layer.full == 1_376_780_288


def test_logits_dominate_llama3_at_long_sequences() -> None:
    # 8192 tokens · (2·2·4096 norm/head inputs + (2 + 4 + 4)·128256 logits)
    # = 8192 · (16,384 + 1,282,560) = 10,640,949,248 bytes
    assert outside_blocks(model_preset("llama3-8b"), 2, 8192).value == 10_640_949_248


def test_activations_scale_with_micro_batch() -> None:
    shape, cluster = model_preset("llama3-8b"), ClusterSpec()
    one = plan(shape, cluster, TrainingJob(micro_batch=1)).activation_total
    four = plan(shape, cluster, TrainingJob(micro_batch=4)).activation_total
    assert one is not None and four is not None
    assert four.value == pytest.approx(4 * one.value)


def test_op_level_recompute_keeps_the_matmul_outputs_by_hand() -> None:
    # GPT-3 (MHA, kv = h, f = 4h, no gate), 16-bit, flash: per token 2·(5h + 2h + 4h) = 22h,
    # and 4·a·b·s log-sum-exp rows: the block input, Q/K/V, attention output, output
    # projection, MLP up and down; norms, GELU and dropout are recomputed.
    layer = layer_activations(GPT3, S, B, e=2, flash=True)
    assert layer.matmul_outputs == 22 * SBH + 4 * A * S * B  # 553,648,128 + 786,432
    L = 96
    op_plan = activations(GPT3, S, B, 2, True, CheckpointMode.OP, 1)
    op = op_plan.blocks.value
    assert op == L * layer.matmul_outputs
    # in backward the top block recomputes its element-wise ops over the 95 below it
    assert op_plan.recompute.value == (L - 1) * layer.matmul_outputs + layer.full
    none = activations(GPT3, S, B, 2, True, CheckpointMode.NONE, 1).blocks.value
    full = activations(GPT3, S, B, 2, True, CheckpointMode.FULL, 1).blocks.value
    assert full < op < none
