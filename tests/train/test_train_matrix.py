"""Strategy x activation-checkpointing matrix on gloo CPU ranks.

Proof of correctness is the loss curve: with fixed seeds every strategy must reproduce
DDP's first steps within RTOL (measured: identical to the last bit on CPU fp32; 1e-5 leaves
room for a reduction-order change). A falling loss alone would prove nothing. Sharding is
proved by the bytes each rank holds, counted from the local shards.
"""

from __future__ import annotations

from typing import Any

import pytest
from _workers import job, tiny_spec
from conftest import run_jobs

RTOL = 1e-5
P = tiny_spec().model.gpt_config().num_parameters() * 4  # fp32 bytes of the full model

MATRIX_2 = [
    ("ddp", "none", "block", 1),
    ("ddp", "full", "block", 1),
    ("fsdp-full", "none", "block", 1),
    ("fsdp-full", "full", "block", 1),
    ("fsdp-full", "selective", "layer", 1),
    ("fsdp-full", "op", "block", 1),
    ("fsdp-full", "every-k", "root", 1),
    ("fsdp-grad-op", "every-k", "block", 1),
    ("fsdp-no-shard", "selective", "block", 1),
    ("ddp", "none", "block", 2),
    ("fsdp-full", "full", "block", 2),
    ("ddp", "none", "block", 4),
    ("fsdp-full", "none", "block", 4),
    ("fsdp-grad-op", "none", "block", 4),
    ("fsdp-no-shard", "none", "block", 4),
]


def _name(strategy: str, ac: str, wrap: str, accum: int) -> str:
    return f"{strategy}-{ac}-{wrap}-a{accum}"


@pytest.fixture(scope="module")
def two_rank_results() -> dict[str, dict[str, Any]]:
    jobs = [
        job(
            tiny_spec(
                _name(*row),
                **{
                    "parallel.strategy": row[0],
                    "parallel.activation_checkpointing": row[1],
                    "parallel.wrap": row[2],
                    "data.grad_accum_steps": row[3],
                },
            )
        )
        for row in MATRIX_2
    ]
    return {r["job"]: r for r in run_jobs(jobs, nproc=2)}


def _assert_matches(losses: list[float], reference: list[float]) -> None:
    assert len(losses) == len(reference) == 4
    for got, want in zip(losses, reference, strict=True):
        assert abs(got - want) <= RTOL * abs(want), (losses, reference)


@pytest.mark.parametrize("row", MATRIX_2[1:], ids=lambda r: _name(*r))
def test_loss_curve_matches_ddp(two_rank_results: dict[str, dict[str, Any]], row: tuple[Any, ...]) -> None:
    reference = two_rank_results[_name("ddp", "none", "block", row[3])]["losses"]
    assert reference[-1] < reference[0] - 0.3  # and the job does learn
    _assert_matches(two_rank_results[_name(*row)]["losses"], reference)


def _mem(results: dict[str, dict[str, Any]], name: str, point: str, kind: str) -> list[int]:
    return [rank_memory[point][kind] for rank_memory in results[name]["memory"]]


def _about(value: int, expected: float) -> bool:
    return abs(value - expected) <= 0.01 * P  # FSDP's dim-0 chunks differ by a row or two


def test_ddp_and_no_shard_hold_everything_on_every_rank(two_rank_results: dict[str, Any]) -> None:
    for name in (_name("ddp", "none", "block", 1), _name("fsdp-no-shard", "selective", "block", 1)):
        assert _mem(two_rank_results, name, "after_step", "params") == [P, P]
        assert _mem(two_rank_results, name, "after_backward", "grads") == [P, P]
        assert _mem(two_rank_results, name, "after_step", "optimizer_state") == [2 * P, 2 * P]


def test_full_shard_holds_half_of_everything(two_rank_results: dict[str, Any]) -> None:
    name = _name("fsdp-full", "none", "block", 1)
    params = _mem(two_rank_results, name, "after_step", "params")
    assert sum(params) == P and all(_about(p, P / 2) for p in params)
    assert all(_about(g, P / 2) for g in _mem(two_rank_results, name, "after_backward", "grads"))
    optim = _mem(two_rank_results, name, "after_step", "optimizer_state")
    assert sum(optim) == 2 * P  # AdamW's two moments, sharded like the parameters


def test_grad_op_holds_full_parameters_between_forward_and_backward(
    two_rank_results: dict[str, Any],
) -> None:
    grad_op = _name("fsdp-grad-op", "every-k", "block", 1)
    full = _name("fsdp-full", "none", "block", 1)
    assert _mem(two_rank_results, grad_op, "after_forward", "params") == [P, P]
    # FULL_SHARD reshards every block after forward except the last (kept for backward).
    assert all(p < 0.8 * P for p in _mem(two_rank_results, full, "after_forward", "params"))
    assert all(_about(p, P / 2) for p in _mem(two_rank_results, grad_op, "after_step", "params"))


def test_accumulation_keeps_sharded_gradients_sharded(two_rank_results: dict[str, Any]) -> None:
    """grad_accum_steps 4: sharded strategies reduce-scatter every micro-batch, so no rank
    ever holds more than its shard of the gradients; replicated ones hold them whole."""
    for strategy in ("fsdp-full", "fsdp-grad-op"):
        peaks = _mem_peak(two_rank_results, _name(strategy, "none", "block", 4))
        assert all(_about(p, P / 2) for p in peaks), (strategy, peaks, P)
    for strategy in ("ddp", "fsdp-no-shard"):
        assert _mem_peak(two_rank_results, _name(strategy, "none", "block", 4)) == [P, P]


def _mem_peak(results: dict[str, dict[str, Any]], name: str) -> list[int]:
    return [rank_memory["peak_grad_bytes"] for rank_memory in results[name]["memory"]]


def test_hybrid_on_four_ranks_matches_ddp_and_shards_within_groups() -> None:
    kw = {"num_workers": 4, "data.micro_batch_size": 1}
    accum = {**kw, "data.grad_accum_steps": 4}
    hybrid = {"parallel.strategy": "fsdp-hybrid"}
    results = {
        r["job"]: r
        for r in run_jobs(
            [
                job(tiny_spec("ddp4", **kw)),
                # The default layout, a shard group per node: pretend nodes of 2 ranks (2 x 2) ...
                job(
                    tiny_spec("hybrid4", **kw, **hybrid, **{"parallel.activation_checkpointing": "full"}),
                    ranks_per_node=2,
                ),
                # ... and all 4 ranks on one node (1 x 4: fsdp-full's layout).
                job(tiny_spec("hybrid4-one-node", **kw, **hybrid)),
                job(tiny_spec("full4", **kw, **{"parallel.strategy": "fsdp-full"})),
                job(tiny_spec("ddp4-a4", **accum)),
                job(tiny_spec("hybrid4-a4", **accum, **hybrid, **{"parallel.replicate_degree": 2})),
            ],
            nproc=4,
        )
    }
    _assert_matches(results["hybrid4"]["losses"], results["ddp4"]["losses"])
    _assert_matches(results["full4"]["losses"], results["ddp4"]["losses"])
    _assert_matches(results["hybrid4-one-node"]["losses"], results["ddp4"]["losses"])
    held = _mem(results, "hybrid4", "after_step", "params")
    assert all(_about(p, P / 2) for p in held)  # 2 replicas x 2 shards
    assert held[0] == held[2] and held[1] == held[3]  # replicas hold the same shard
    assert all(_about(p, P / 4) for p in _mem(results, "hybrid4-one-node", "after_step", "params"))
    assert all(_about(p, P / 4) for p in _mem(results, "full4", "after_step", "params"))
    # Accumulating 4 micro-batches, HSDP reduce-scatters each one inside its shard group and
    # all-reduces across replicas once: a rank holds half the gradients, never all of them.
    _assert_matches(results["hybrid4-a4"]["losses"], results["ddp4-a4"]["losses"])
    assert all(_about(p, P / 2) for p in _mem_peak(results, "hybrid4-a4")), _mem_peak(results, "hybrid4-a4")
