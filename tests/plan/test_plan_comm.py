"""Communication per GPU per step with ring costs; ZeRO-3 against ZeRO-1.

Ψ = 70,553,706,496, N = 64, bf16 parameters (2 bytes), gradients reduced in fp32 (4 bytes)
by every strategy: a ring all-gather or reduce-scatter of M bytes sends (N-1)/N·M per rank,
an all-reduce 2·(N-1)/N·M.
"""

from __future__ import annotations

import pytest

from switchyard.train.plan import ClusterSpec, Precision, TrainingJob, plan
from switchyard.train.plan.comm import zero3_over_zero1
from switchyard.train.strategy import Strategy

PSI = 70_553_706_496
CLUSTER = ClusterSpec(gpus=64)


def _comm(strategy: Strategy, cluster: ClusterSpec = CLUSTER, **job: object) -> tuple[float, float]:
    p = plan(PSI, cluster, TrainingJob(strategy=strategy, **job))  # type: ignore[arg-type]
    return p.comm.bytes_per_gpu, p.comm.seconds


def test_zero1_is_a_reduce_scatter_and_an_all_gather() -> None:
    # fp32 gradients reduce-scattered + bf16 parameters gathered: (63/64)·(4Ψ + 2Ψ)
    # = 416,707,828,992 bytes; at 45 GB/s: 9.2602 s. Latency: ceil(Ψ/5e8) = 142 buckets, each
    # reduced to its 64 owners (9,088 launches) and one gather, 63 ring steps of 10 µs each:
    # (9,088 + 1)·63·10e-6 = 5.72607 s
    volume, seconds = _comm(Strategy.ZERO1)
    assert volume == pytest.approx(416_707_828_992, rel=1e-9)
    assert seconds == pytest.approx(416_707_828_992 / 45e9 + 9_089 * 63 * 10e-6, rel=1e-9)
    assert _comm(Strategy.ZERO2)[0] == volume  # one micro-batch: the same transfers


def test_zero3_adds_a_second_parameter_gather() -> None:
    # all-gather fwd + all-gather bwd (bf16) + reduce-scatter (fp32): (63/64)·(2·2Ψ + 4Ψ)
    # = 555,610,438,656: 8Ψ against ZeRO-1's 6Ψ, so 4/3
    volume, _ = _comm(Strategy.ZERO3)
    assert volume == pytest.approx(555_610_438_656, rel=1e-9)
    assert volume / _comm(Strategy.ZERO1)[0] == pytest.approx(4 / 3)
    assert zero3_over_zero1(PSI, CLUSTER, Precision.BF16) == pytest.approx(4 / 3)
    # fp32 throughout every transfer is 4Ψ: 3 against 2, the ZeRO paper's 1.5
    assert zero3_over_zero1(PSI, CLUSTER, Precision.FP32) == pytest.approx(1.5)


def test_ddp_all_reduces_fp32_gradients() -> None:
    # 2·(63/64)·4Ψ = 555,610,438,656 bytes (the trainer's DDP reduces fp32 gradients)
    assert _comm(Strategy.DDP)[0] == pytest.approx(555_610_438_656, rel=1e-9)


def test_fsdp_full_gathers_bf16_and_reduces_fp32() -> None:
    # 2·(63/64)·2Ψ + (63/64)·4Ψ = (63/64)·8Ψ = 555,610,438,656
    assert _comm(Strategy.FSDP_FULL)[0] == pytest.approx(555_610_438_656, rel=1e-9)
    # SHARD_GRAD_OP gathers once: (63/64)·(2Ψ + 4Ψ) = 416,707,828,992
    assert _comm(Strategy.FSDP_GRAD_OP)[0] == pytest.approx(416_707_828_992, rel=1e-9)


def test_hybrid_splits_intra_and_inter_node_traffic() -> None:
    # G = 8 inside a node at 360 GB/s: (7/8)·(2·2Ψ + 4Ψ) = 7Ψ = 493,875,945,472
    # across 8 groups at 45 GB/s: all-reduce of the 4Ψ/8 shard, 2·(7/8)·Ψ/2 = 0.875Ψ.
    # Only Ψ known, so one launch per pass: 2 gathers + 1 reduce-scatter of 7 NVLink steps
    # (2 µs) and 1 all-reduce of 2·7 network steps (10 µs): 42 + 140 µs
    volume, seconds = _comm(Strategy.FSDP_HYBRID)
    assert volume == pytest.approx(7.875 * PSI, rel=1e-9)
    assert seconds == pytest.approx(7 * PSI / 360e9 + 0.875 * PSI / 45e9 + 182e-6, rel=1e-9)


def test_gradient_accumulation_repeats_gathers_not_zero1_reduction() -> None:
    # 4 micro-batches: ZeRO-3 gathers and reduce-scatters each one; ZeRO-1 reduces once;
    # ZeRO-2 reduce-scatters each one and gathers once: (63/64)·(4·4Ψ + 2Ψ)
    assert _comm(Strategy.ZERO3, grad_accum=4)[0] == pytest.approx(4 * _comm(Strategy.ZERO3)[0])
    assert _comm(Strategy.ZERO1, grad_accum=4)[0] == _comm(Strategy.ZERO1)[0]
    assert _comm(Strategy.ZERO2, grad_accum=4)[0] == pytest.approx(63 / 64 * 18 * PSI, rel=1e-9)


def test_accumulation_traffic_is_what_the_trainer_runs() -> None:
    # The trainer: DDP and NO_SHARD reduce once per step; FULL_SHARD reduce-scatters (and
    # gathers) every micro-batch; HSDP reduce-scatters every micro-batch inside its group of
    # 8 but all-reduces the Ψ/2 shard sums across groups once: 4·7Ψ + 0.875Ψ.
    for strategy in (Strategy.DDP, Strategy.FSDP_NO_SHARD):
        assert _comm(strategy, grad_accum=4)[0] == _comm(strategy)[0]
    assert _comm(Strategy.FSDP_FULL, grad_accum=4)[0] == pytest.approx(4 * _comm(Strategy.FSDP_FULL)[0])
    assert _comm(Strategy.FSDP_HYBRID, grad_accum=4)[0] == pytest.approx((4 * 7 + 0.875) * PSI, rel=1e-9)


def test_one_node_uses_nvlink_and_one_gpu_sends_nothing() -> None:
    # 8 GPUs: (7/8)·6Ψ at 360 GB/s, and (142·8 reduces + 1 gather)·7 NVLink steps of 2 µs
    _, seconds = _comm(Strategy.ZERO1, ClusterSpec(gpus=8))
    assert seconds == pytest.approx(7 / 8 * 6 * PSI / 360e9 + 1_137 * 7 * 2e-6, rel=1e-9)
    assert _comm(Strategy.ZERO3, ClusterSpec(gpus=1)) == (0, 0)
