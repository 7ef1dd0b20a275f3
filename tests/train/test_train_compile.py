"""`parallel.compile`: each transformer block compiled (inductor, on CPU with the host's C++
compiler) after activation checkpointing and before FSDP, giving eager's losses."""

from __future__ import annotations

import shutil

import pytest
from _workers import job, tiny_spec
from conftest import run_jobs

pytestmark = [pytest.mark.slow, pytest.mark.skipif(shutil.which("g++") is None, reason="inductor needs a C++ compiler")]


def test_compiled_blocks_under_fsdp_and_op_checkpointing_train_as_eager() -> None:
    def fsdp(name: str, compiled: bool) -> dict[str, object]:
        changes = {"parallel.strategy": "fsdp-full", "parallel.activation_checkpointing": "op"}
        return job(tiny_spec(name, **changes, **{"parallel.compile": compiled}))

    eager, compiled = run_jobs([fsdp("eager", False), fsdp("compiled", True)], nproc=2)
    assert eager["graphs"] == 0 and compiled["graphs"] > 0  # the flag compiled something
    assert eager["losses"][-1] < eager["losses"][0] - 0.3
    for got, want in zip(compiled["losses"], eager["losses"], strict=True):
        # Inductor fuses and reorders float ops: measured within 1e-6 relative of eager.
        assert abs(got - want) <= 1e-5 * abs(want), (compiled["losses"], eager["losses"])
