"""`bench/gpu_check.sh --cpu`: the GPU check's sections run end to end on the tiny model, so
the script a GPU machine runs is exercised here (its numbers mean nothing on CPU)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]


def test_every_section_prints_its_rows_on_cpu() -> None:
    run = subprocess.run(
        ["bash", str(ROOT / "bench" / "gpu_check.sh"), "--cpu"],
        env={**os.environ, "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    rows = [line.split("|")[1:-1] for line in run.stdout.splitlines() if line.startswith("| ")]
    cells = [[c.strip() for c in r] for r in rows]
    assert [c[:2] for c in cells[2:]] == [
        ["fsdp", "fp32 fsdp-full (cpu)"],
        ["prefetch", "off: pageable copy in the step"],
        ["prefetch", "on: batch thread + side stream"],
        ["compile", "off: eager"],
        ["compile", "on: each block"],
        ["compile", "losses on vs off"],
    ], run.stdout
    for c in cells[2:7]:
        assert float(c[2]) > 0 and float(c[3].replace(",", "")) > 0, c  # step ms, tokens/s
    assert re.fullmatch(r"[\d.]+ GiB peak_rss", cells[2][5]) and cells[2][6].startswith("planner "), cells[2]
    difference = float(cells[-1][-1].removeprefix("max relative difference "))
    assert difference <= 1e-5
