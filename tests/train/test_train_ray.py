"""The same loop under Ray Train's TorchTrainer: checkpoints reported to Ray, resume by
re-running `fit()`, and a preemption notice through the GCS channel.

Run under `flock /tmp/switchyard-ray.lock` (these tests start Ray).
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from _workers import tiny_spec

from switchyard.cluster.preemption_channel import GcsPreemptionChannel, send_notice
from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.ray_trainer import _DriverSigterm, run_on_ray
from switchyard.train.sweep import run_sweep

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_ddp_checkpoints_through_ray_and_resumes_on_refit(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    spec = tiny_spec("ray-ddp", steps=3, **{"checkpoint.every_steps": 2, "checkpoint.resume": True})
    first = run_on_ray(spec, storage_path=str(tmp_path))
    assert (first.status, first.step, first.resumable) == ("completed", 3, False)
    assert first.checkpoint == f"{tmp_path}/ray-ddp/step-00000003"
    ref = CheckpointStore(f"{tmp_path}/ray-ddp", tmp_path / "cache").latest_valid()
    assert ref is not None and ref.step == 3 and ref.manifest["world_size"] == 2
    # Ray merged both ranks' parts into one folder, manifest included.
    assert {"train-state-rank-00000.pt", "train-state-rank-00001.pt", ".metadata"} <= set(ref.manifest["files"])

    longer = run_on_ray(spec.with_changes(steps=4), storage_path=str(tmp_path))
    assert longer.resumed_from == first.checkpoint and longer.step == 4


def test_gcs_notice_preempts_fsdp_job_which_then_resumes(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    spec = tiny_spec(
        "ray-fsdp",
        steps=4,
        **{
            "parallel.strategy": "fsdp-full",
            "parallel.activation_checkpointing": "selective",
            "checkpoint.resume": True,
        },
    )
    channel = GcsPreemptionChannel()
    # Sent before the workers exist: the GCS keeps it; rank 0 reads it after step 1.
    send_notice("job-42", "scheduler: higher-priority gang", deadline=None)
    assert channel.poll("job-42") is not None
    preempted = run_on_ray(spec, storage_path=str(tmp_path), job_id="job-42")
    assert (preempted.status, preempted.resumable, preempted.step) == ("preempted", True, 1)
    assert preempted.reason == "scheduler: higher-priority gang"
    channel.clear("job-42")
    done = run_on_ray(spec, storage_path=str(tmp_path), job_id="job-42")
    assert done.status == "completed" and done.step == 4
    assert done.resumed_from == preempted.checkpoint


def test_tune_sweep_over_lr_and_batch_size(ray_cluster: dict[str, Any], tmp_path: Path) -> None:
    spec = tiny_spec("sweep", steps=3)
    rows = run_sweep(spec, [1e-4, 3e-3], [2], storage_path=str(tmp_path))
    assert [r["step"] for r in rows] == [3, 3]
    # Best first; 3 steps at lr 1e-4 barely move a fresh model, lr 3e-3 does.
    assert rows[0]["lr"] == 3e-3 and rows[0]["loss"] < rows[1]["loss"] - 0.1


def test_sigterm_to_the_driver_becomes_a_gcs_notice(ray_cluster: dict[str, Any]) -> None:
    """`ray job stop` SIGTERMs the driver; run_on_ray turns that into a notice, so the
    workers checkpoint instead of dying mid-step."""
    channel = GcsPreemptionChannel()
    before = signal.getsignal(signal.SIGTERM)
    with _DriverSigterm("job-sigterm"):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)  # the handler runs between bytecodes of the main thread
    notice = channel.poll("job-sigterm")
    assert notice is not None and notice.reason == "SIGTERM on driver"
    channel.clear("job-sigterm")
    assert signal.getsignal(signal.SIGTERM) == before  # the driver's handler is restored
