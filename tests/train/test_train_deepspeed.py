"""DeepSpeed ZeRO 1/2/3 on gloo CPU ranks, with a plain torch AdamW (nothing compiled)."""

from __future__ import annotations

from pathlib import Path

import pytest
from _workers import job, tiny_spec
from conftest import run_jobs

from switchyard.train.spec import JobSpec

pytestmark = pytest.mark.slow
RTOL = 1e-5
P = tiny_spec().model.gpt_config().num_parameters() * 4


def test_zero_stages_match_ddp_shard_the_right_state_and_resume_exactly(tmp_path: Path) -> None:
    def zero(stage: str, ac: str = "none") -> JobSpec:
        return tiny_spec(stage, steps=4, **{"parallel.strategy": stage, "parallel.activation_checkpointing": ac})

    store = str(tmp_path / "zero3")
    resumable = tiny_spec("zero3-resume", steps=4, **{"parallel.strategy": "zero3", "checkpoint.resume": True})
    first = {
        r["job"]: r
        for r in run_jobs(
            [
                job(tiny_spec("ddp")),
                job(zero("zero1")),
                job(zero("zero2", "full")),
                job(zero("zero3", "selective")),
                # Optimizer offload to host memory with the torch AdamW: no CPU-Adam op to build.
                job(tiny_spec("zero2-offload", **{"parallel.strategy": "zero2", "parallel.offload": "cpu"})),
                job(resumable, store=store, stop_after=2),
            ],
            nproc=2,
        )
    }
    reference = first["ddp"]["losses"]
    for stage in ("zero1", "zero2", "zero3", "zero2-offload"):
        for got, want in zip(first[stage]["losses"], reference, strict=True):
            assert abs(got - want) <= RTOL * abs(want), (stage, first[stage]["losses"], reference)
    optim = {s: [m["after_step"]["optimizer_state"] for m in first[s]["memory"]] for s in first}
    params = {s: [m["after_step"]["params"] for m in first[s]["memory"]] for s in first}
    assert optim["ddp"] == [2 * P, 2 * P]
    for stage in ("zero1", "zero2", "zero3"):
        # AdamW's fp32 moments over this rank's partition only: 2 x P/2.
        assert optim[stage] == [P, P], stage
    assert params["zero1"] == params["zero2"] == [P, P]  # ZeRO-1/2 keep full parameters
    assert all(abs(p - P / 2) < 0.01 * P for p in params["zero3"])  # ZeRO-3 partitions them

    finetune = tiny_spec("ft", steps=1, init_from=first["zero3-resume"]["checkpoint"])
    second = {r["job"]: r for r in run_jobs([job(resumable, store=store), job(finetune)], nproc=2)}
    assert second["zero3-resume"]["resumed_from"].endswith("step-00000002")
    whole = first["zero3"]["losses"]  # same job uninterrupted (AC does not change numerics)
    got = first["zero3-resume"]["losses"] + second["zero3-resume"]["losses"]
    assert all(abs(a - b) <= RTOL * abs(b) for a, b in zip(got, whole, strict=True)), (got, whole)
    assert second["ft"]["losses"][0] < reference[0] - 0.2  # started from the ZeRO weights
