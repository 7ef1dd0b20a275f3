"""The calibration terms by hand: which parameters ZeRO-3 and FSDP gather as the trainer
runs them, the activation peak of backward, shared NICs, per-launch latency and exposed
communication. The measured side is in test_plan_calibration_{comm,activations}.py."""

from __future__ import annotations

import pytest

from switchyard.train.plan import ClusterSpec, Precision, TrainingJob, model_preset, plan
from switchyard.train.plan.zero3 import zero3_gathers
from switchyard.train.strategy import CheckpointMode, Strategy


def test_zero3_gathers_a_large_model_twice_but_the_head_once() -> None:
    # Llama 3 8B: every matrix is over 1e5 elements; the 65 norms (32·2 + 1, 4,096 each =
    # 266,240) persist. Each block's matrices are used again in backward only after more
    # than 1e9 elements of other modules, so they are released and gathered again; the
    # head is used again at once (the last module of forward is the first of backward):
    # 2·(8,030,261,248 - 266,240) - 525,336,576 = 15,534,653,440 elements per micro-batch,
    # in 226 forward + 225 backward gathers.
    z = zero3_gathers(model_preset("llama3-8b"))
    assert (z.per_micro_batch, z.calls_per_micro_batch, z.persistent) == (15_534_653_440, 451, 266_240)


def test_zero3_gathers_a_small_model_once_and_its_small_tensors_once_a_step() -> None:
    # gpt-small (4 blocks, h = 256, f = 1024, tied 257-word embedding): per block only qkv
    # (196,608), up and down (262,144 each) pass 1e5 elements: 720,896 per block, 2,883,584
    # in all, gathered in forward and kept for backward (1e9 elements is far away). The rest,
    # 3,290,880 - 2,883,584 = 407,296, persists and is gathered once after each step.
    z = zero3_gathers(model_preset("gpt-small"))
    assert (z.per_micro_batch, z.calls_per_micro_batch, z.persistent) == (2_883_584, 12, 407_296)


def test_full_shard_does_not_gather_the_root_or_the_last_block_again() -> None:
    # gpt-tiny: Ψ = 124,736, block 49,984, root (embeddings, final norm) 24,768. Per micro-batch
    # forward gathers Ψ, backward only block 0 (block 1 is kept, the root is never resharded):
    # fp32, 4 ranks, 2 micro-batches: 2·(3/4)·4·(124,736 + 49,984) = 1,048,320 B gathered,
    # 2·(3/4)·4·124,736 = 748,416 B reduce-scattered.
    job = TrainingJob(strategy=Strategy.FSDP_FULL, precision=Precision.FP32, grad_accum=2, seq_len=32)
    gathers, reduce = plan(model_preset("gpt-tiny"), ClusterSpec(gpus=4), job).comm.transfers
    assert (gathers.bytes_per_gpu, reduce.bytes_per_gpu) == (1_048_320, 748_416)
    # Launches: 3 units forward + 1 backward gather, 3 reduce-scatters, per micro-batch, each
    # 3 ring steps of 2 µs: (8 + 6)·3·2 µs = 84 µs.
    assert gathers.latency_seconds + reduce.latency_seconds == pytest.approx(84e-6)
    # Exposed: the root's gather (first) and its reduce-scatter (last) per micro-batch:
    # 2·(3/4)·4·24,768 B each = 297,216 B at 360 GB/s, plus 2 + 2 launches of 3·2 µs.
    exposed = plan(model_preset("gpt-tiny"), ClusterSpec(gpus=4), job).comm.exposed_seconds
    assert exposed == pytest.approx(297_216 / 360e9 + 4 * 3 * 2e-6)


def test_a_step_hides_all_communication_but_the_exposed_part() -> None:
    p = plan(model_preset("llama3-8b"), ClusterSpec(gpus=64), TrainingJob(strategy=Strategy.FSDP_FULL))
    assert p.compute is not None and p.step_seconds is not None
    hidden = p.comm.seconds - p.comm.exposed_seconds
    assert 0 < p.comm.exposed_seconds < hidden
    assert p.step_seconds == pytest.approx(max(p.compute.value, hidden) + p.comm.exposed_seconds)


def test_gpus_share_fewer_nics_than_they_are() -> None:
    # 2 nodes of 8 GPUs with 2 NICs of 45 GB/s each: a GPU's ring gets 45·2/8 = 11.25 GB/s,
    # all the NICs together 2·2·45 = 180 GB/s. DDP of Ψ = 1e9: 2·(15/16)·4e9 = 7.5e9 B at
    # 11.25 GB/s = 0.6667 s, and ceil(4e9 / 25 MiB) = 153 buckets of 2·15 network steps of
    # 10 µs = 0.0459 s.
    cluster = ClusterSpec(gpus=16, nics_per_node=2)
    assert (cluster.network_gbps_per_gpu, cluster.aggregate_network_gbps) == (11.25, 180.0)
    comm = plan(10**9, cluster, TrainingJob(strategy=Strategy.DDP)).comm
    assert comm.bytes_per_gpu == 7.5e9
    assert comm.seconds == pytest.approx(7.5e9 / 11.25e9 + 153 * 30 * 10e-6)
    assert ClusterSpec(gpus=16).network_gbps_per_gpu == 45.0  # one NIC per GPU


def test_backward_peak_is_the_recomputing_block_over_the_kept_inputs() -> None:
    # gpt-tiny, fp32, 2 x 64 tokens (sb = 128), full recompute. A layer keeps, per token,
    # 4·(3h + 2h) + 4·h + 2·4·4h + 2·4·h = 1,280 + 2,304 + 512 = 4,096 B, ·128 = 524,288, plus
    # flash's log-sum-exp rows 4·a·sb = 1,024: 525,312. End of forward: 2 block inputs
    # (2·4·128·64 = 65,536) + head (128·(2·4·64 + 8·257) = 328,704) = 394,240. Backward of
    # block 1: block 0's input (32,768) + block 1 recomputing (525,312) = 558,080, the peak.
    job = TrainingJob(precision=Precision.FP32, seq_len=64, micro_batch=2, checkpointing=CheckpointMode.FULL)
    acts = plan(model_preset("gpt-tiny"), ClusterSpec(gpus=1), job).activations
    assert acts is not None
    assert (acts.blocks.value, acts.outside.value, acts.recompute.value) == (65_536, 328_704, 558_080)
    assert acts.total.value == 558_080
