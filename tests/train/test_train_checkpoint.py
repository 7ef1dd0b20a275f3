from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from _workers import job, tiny_spec
from conftest import run_jobs

from switchyard.train.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointStore,
    build_manifest,
    file_table,
    open_checkpoint,
)


def _fake_checkpoint(root: Path, step: int, *, manifest: bool = True) -> Path:
    folder = root / f"step-{step:08d}"
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(bytes(range(256)) * 4)
    (folder / ".metadata").write_bytes(b"meta")
    if manifest:
        table = file_table(folder)
        (folder / MANIFEST).write_text(json.dumps(build_manifest(table, step=step, fmt="dcp")))
    return folder


def test_latest_valid_picks_newest_complete(tmp_path: Path) -> None:
    for step in (2, 4):
        _fake_checkpoint(tmp_path, step)
    ref = CheckpointStore(str(tmp_path), tmp_path / "cache").latest_valid()
    assert ref is not None and ref.step == 4 and ref.name == "step-00000004"


def test_empty_store_means_fresh_start(tmp_path: Path) -> None:
    assert CheckpointStore(str(tmp_path / "none"), tmp_path / "c").latest_valid() is None


@pytest.mark.parametrize("damage", ["no-manifest", "truncated", "bitflip", "missing-file", "bad-json"])
def test_damaged_newest_checkpoint_is_skipped_with_a_reason(
    tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture
) -> None:
    _fake_checkpoint(tmp_path, 2)
    newest = _fake_checkpoint(tmp_path, 4, manifest=damage != "no-manifest")
    shard = newest / "__0_0.distcp"
    if damage == "truncated":
        shard.write_bytes(shard.read_bytes()[:100])
    elif damage == "bitflip":
        data = bytearray(shard.read_bytes())
        data[10] ^= 1
        shard.write_bytes(bytes(data))
    elif damage == "missing-file":
        shard.unlink()
    elif damage == "bad-json":
        (newest / MANIFEST).write_text("{not json")
    expected = {
        "no-manifest": "no manifest.json",
        "truncated": "manifest says",
        "bitflip": "sha256",
        "missing-file": "missing file",
        "bad-json": "unreadable",
    }
    with caplog.at_level(logging.WARNING):
        ref = CheckpointStore(str(tmp_path), tmp_path / "cache").latest_valid()
    assert ref is not None and ref.step == 2
    assert "step-00000004 skipped" in caplog.text and expected[damage] in caplog.text


def test_no_valid_checkpoint_is_an_error_not_a_fresh_start(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, 3, manifest=False)
    with pytest.raises(CheckpointError, match=r"none is valid.*step-00000003: no manifest"):
        CheckpointStore(str(tmp_path), tmp_path / "cache").latest_valid()


def test_prune_keeps_newest_complete_and_leaves_partial(tmp_path: Path) -> None:
    for step in (1, 2, 3):
        _fake_checkpoint(tmp_path, step)
    _fake_checkpoint(tmp_path, 9, manifest=False)
    store = CheckpointStore(str(tmp_path), tmp_path / "cache")
    assert store.prune(keep=2) == ["step-00000001"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000002", "step-00000003", "step-00000009"]


def test_open_checkpoint_rejects_a_partial_folder(tmp_path: Path) -> None:
    _fake_checkpoint(tmp_path, 5, manifest=False)
    with pytest.raises(CheckpointError, match="step-00000005 is not usable"):
        open_checkpoint(str(tmp_path / "step-00000005"), tmp_path / "cache")


def test_resume_is_exact_locally_and_from_s3_and_init_from_works(tmp_path: Path, s3_bucket: str) -> None:
    """Interrupted at step 3 and resumed in fresh processes, the loss curve is the
    uninterrupted one exactly (local DCP and an s3:// store on moto); a fine-tune with
    `init_from` starts from the base job's weights under a different strategy."""
    spec = tiny_spec(
        "resume",
        steps=6,
        **{
            "parallel.strategy": "fsdp-full",
            "parallel.activation_checkpointing": "selective",
            "checkpoint.resume": True,
        },
    )
    local, remote = str(tmp_path / "ckpt"), f"{s3_bucket}/jobs/resume"
    first = run_jobs(
        [
            job(spec, store=str(tmp_path / "whole")),
            job(spec, store=local, stop_after=3),
            job(spec, store=remote, stop_after=3),
        ],
        nproc=2,
    )
    whole, cut_local, cut_s3 = first
    assert whole["status"] == "completed" and len(whole["losses"]) == 6
    assert cut_local["status"] == cut_s3["status"] == "preempted" and cut_s3["step"] == 3
    assert cut_s3["checkpoint"] == f"{remote}/step-00000003"
    base = whole["checkpoint"]
    finetune = tiny_spec("finetune", steps=2, init_from=base, **{"parallel.strategy": "ddp"})
    fresh = tiny_spec("fresh", steps=2, **{"parallel.strategy": "ddp"})
    second = run_jobs([job(spec, store=local), job(spec, store=remote), job(finetune), job(fresh)], nproc=2)
    resumed_local, resumed_s3, tuned, scratch = second
    for cut, resumed in ((cut_local, resumed_local), (cut_s3, resumed_s3)):
        assert resumed["resumed_from"] == cut["checkpoint"]
        assert cut["losses"] + resumed["losses"] == whole["losses"]
    assert tuned["losses"][0] < scratch["losses"][0] - 0.5
    assert tuned["losses"][0] < whole["losses"][-1] + 0.1


def test_a_reporting_publisher_never_carries_the_manifest(tmp_path: Path) -> None:
    """Under Ray each rank's files are uploaded on their own (file by file on S3): a manifest
    that travelled with rank 0's part could be stored before the files it names (a node lost
    mid-upload left `manifest.json` without `.metadata`, and resume then refused the run). The
    trainer writes the manifest itself, once every rank's files are stored."""
    import torch

    from switchyard.train.loop import RunContext, Trainer

    store = CheckpointStore(str(tmp_path / "ckpt"), tmp_path / "cache")
    events: list[str] = []

    class Copying:
        """Stands in for `RayReportPublisher`: copies the part as Ray would, records the order."""

        def __call__(self, name: str, rank_dir: Path, own: dict, manifest: dict | None, metrics: dict) -> str:
            events.append(f"files {name}")
            assert not (rank_dir / MANIFEST).exists(), "the manifest must not travel with the files"
            assert not (tmp_path / "ckpt" / name / MANIFEST).exists()
            for relpath in own:
                store.location.put_file(name, relpath, rank_dir / relpath)
            return store.location.child_uri(name)

        def published(self) -> None:
            events.append("published")

    spec = tiny_spec("order", steps=4, **{"checkpoint.every_steps": 2, "parallel.strategy": "ddp"})
    ctx = RunContext(
        rank=0,
        world_size=1,
        device=torch.device("cpu"),
        job_id="order",
        store=store,
        work_dir=tmp_path / "work",
        handle_sigterm=False,
        publisher=Copying(),
        prune=False,
    )
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        result = json.loads(Trainer(spec, ctx).run().to_json())
    finally:
        dist.destroy_process_group()
    assert result["status"] == "completed"
    assert events and all(e == "published" for e in events[1::2]), events
    for name in {e.split()[1] for e in events if e.startswith("files")}:
        assert (tmp_path / "ckpt" / name / MANIFEST).exists()
    assert open_checkpoint(result["checkpoint"], tmp_path / "check") is not None
