"""A Ray Tune sweep whose trials need GPUs: each trial asks the scheduler for its lease like a
job does, waits in the queue while its team's quota is used up, and releases when done."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from switchyard.train.spec import JobSpec
from switchyard.train.sweep import run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]

POLICY = """
version: 1
priority_classes:
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
teams:
  - name: sweepers   # one GPU at a time, never more: the second trial must wait for the first
    quotas: [{classes: [training], guaranteed_gpus: 1, borrowing_limit_gpus: 0}]
"""


def test_gpu_trials_are_admitted_by_the_scheduler_one_after_the_other(
    platform_scheduler_with: Callable[..., Any], tmp_path: Path
) -> None:
    scheduler = platform_scheduler_with(POLICY)
    spec = JobSpec.model_validate(
        {
            "name": "sweep-gpu",
            "steps": 2,
            "num_workers": 1,
            "model": {"preset": "tiny"},
            "data": {"source": "synthetic", "seq_len": 32, "micro_batch_size": 2},
            "parallel": {"strategy": "ddp"},
        }
    )
    rows = run_sweep(spec, [1e-3, 3e-3], [2], storage_path=str(tmp_path), gpus_per_trial=1, team="sweepers")
    assert sorted(r["lr"] for r in rows) == [1e-3, 3e-3] and all(r["step"] == 2 for r in rows)

    workloads = {r["workload_id"] for r in rows}
    events = [e for e in ray.get(scheduler.events.remote()) if e["workload_id"] in workloads]
    for wid in workloads:
        assert [e["kind"] for e in events if e["workload_id"] == wid] == ["submitted", "admitted", "released"]
    # Both were queued at once; the quota let one run, and the other was admitted only when
    # the first gave its GPU back.
    submitted = [e["seq"] for e in events if e["kind"] == "submitted"]
    first_admitted, second_admitted = [e for e in events if e["kind"] == "admitted"]
    [first_released] = [
        e for e in events if e["kind"] == "released" and e["workload_id"] == first_admitted["workload_id"]
    ]
    assert max(submitted) < first_released["seq"] < second_admitted["seq"]
    # Each trial trained on the one GPU it was granted: one worker, pinned there.
    assert all(len(e["nodes"]) == 1 for e in (first_admitted, second_admitted))
