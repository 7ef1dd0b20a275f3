"""Resume reads only each rank's part of a checkpoint and verifies it once; periodic saves
run in the background and a crash before their commit loses nothing but that save.

Two gloo ranks, fsdp-full: rank r's shards are in `__r_0.distcp`; an item every rank holds
(the optimizer's step counters, its param groups) is stored once, by one of the ranks.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

from _resume_workers import crash_before_commit, resume_job, resume_jobs
from _workers import tiny_spec

from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.launch import spawn_group
from switchyard.train.spec import JobSpec

STEP4 = "step-00000004"


def _spec() -> JobSpec:
    fields = {"parallel.strategy": "fsdp-full", "checkpoint.every_steps": 2, "checkpoint.resume": True}
    return tiny_spec("io", steps=6, **fields)


def _run(jobs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "results.json"
        spawn_group(resume_jobs, 2, jobs, str(out), finished=out.is_file)
        results: list[dict[str, Any]] = json.loads(out.read_text())
    return results


def _sizes(manifest: dict[str, Any]) -> dict[str, int]:
    return {name: entry["size"] for name, entry in manifest["files"].items()}


def _assert_reads_own_part(resumed: dict[str, Any], manifest: dict[str, Any]) -> None:
    sizes = _sizes(manifest)
    total = sum(sizes.values())
    for rank, reads in enumerate(resumed["reads"]):
        own, peer = f"__{rank}_0.distcp", f"__{1 - rank}_0.distcp"
        data = {name: n for name, n in reads["read"].items() if name != "manifest.json"}
        assert set(data) <= {own, peer, ".metadata", f"train-state-rank-{rank:05d}.pt"}, (rank, data)
        assert data[own] == sizes[own], (rank, data)  # all of its own shards ...
        assert data.get(peer, 0) < 0.1 * sizes[peer], (rank, data)  # ... of the peer's, shared items only
        assert sum(data.values()) < 0.6 * total, (rank, data, total)
        assert reads["hashed"] == sum(data.values()), (rank, reads)  # every byte read is verified, once
    assert "manifest.json" not in resumed["reads"][1]["read"]  # rank 0 chose; rank 1 read no manifest


def test_resume_reads_only_its_own_shards_verified_once_locally_and_from_s3(tmp_path: Path, s3_bucket: str) -> None:
    """Crashed after step 5 (the step-4 save was in flight) and resumed in fresh processes:
    each rank reads its own `.distcp` whole, a sliver of the peer's, `.metadata` and its
    own train state, hashes exactly what it read, and only rank 0 reads a manifest (on S3,
    only rank 0 lists). Losses equal the uninterrupted run's, after background and after
    synchronous saves alike."""
    import boto3

    spec = _spec()
    local, remote, sync = str(tmp_path / "local"), f"{s3_bucket}/io", str(tmp_path / "sync")
    whole, cut, resumed, cut_s3, resumed_s3, cut_sync, resumed_sync = _run(
        [
            resume_job(spec, str(tmp_path / "whole")),
            resume_job(spec, local, crash_after=5),
            resume_job(spec, local, count=True),
            resume_job(spec, remote, crash_after=5),
            resume_job(spec, remote, count=True),
            resume_job(spec, sync, crash_after=5, async_save=False),
            resume_job(spec, sync, count=True, async_save=False),
        ]
    )
    # Periodic saves run in the background; the final one does not; async_save: false, none.
    assert [(s["step"], s["background"]) for s in whole["saves"]] == [(2, True), (4, True), (6, False)]
    assert [s["background"] for s in cut_sync["saves"]] == [False, False]
    for c, r in ((cut, resumed), (cut_s3, resumed_s3), (cut_sync, resumed_sync)):
        # The step-4 save was still in flight at the crash: the run completed it before failing.
        assert c["status"] == "crashed" and r["resumed_from"].endswith(STEP4), (c, r)
        assert c["losses"] + r["losses"] == whole["losses"]
    _assert_reads_own_part(resumed, json.loads((Path(local) / STEP4 / "manifest.json").read_text()))
    _assert_reads_own_part(resumed_sync, json.loads((Path(sync) / STEP4 / "manifest.json").read_text()))
    body = boto3.client("s3").get_object(Bucket="ckpt", Key=f"io/{STEP4}/manifest.json")["Body"].read()
    _assert_reads_own_part(resumed_s3, json.loads(body))
    assert resumed_s3["reads"][1]["listings"] == 0 and resumed_s3["reads"][0]["listings"] >= 1


def test_a_crash_before_commit_keeps_the_previous_checkpoint_and_a_corrupt_shard_is_skipped(tmp_path: Path) -> None:
    """A background save whose files are all stored but whose manifest is not yet written
    when the processes die is skipped on resume; so is a complete checkpoint with one flipped
    byte in rank 1's shards, which only rank 1 reads: every rank agrees, the message names
    the item, and both runs resume from step 2 with the uninterrupted run's losses."""
    spec = _spec()
    crashed, flipped, out = tmp_path / "crashed", tmp_path / "flipped", tmp_path / "out"
    out.mkdir()
    jobs = [resume_job(spec, str(tmp_path / "whole")), resume_job(spec, str(flipped), crash_after=5)]
    spawn_group(
        crash_before_commit,
        2,
        jobs,
        spec.model_dump_json(),
        str(crashed),
        str(out),
        finished=lambda: (out / "rank1.json").is_file(),
    )
    whole, _ = json.loads((out / "jobs.json").read_text())
    for rank in (0, 1):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        # Steps 5 ran while the step-4 save was uncommitted: the loop did not wait for it.
        assert seen["steps"] == [1, 2, 3, 4, 5] and not any(seen["committed_at"].values()), seen
    assert json.loads((out / "rank0.json").read_text())["manifest_pending"]
    stored = {p.name for p in (crashed / STEP4).iterdir()}
    assert {".metadata", "__0_0.distcp", "__1_0.distcp"} <= stored and "manifest.json" not in stored, stored
    ref = CheckpointStore(str(crashed), tmp_path / "cache").latest_valid()
    assert ref is not None and ref.step == 2

    shard = flipped / STEP4 / "__1_0.distcp"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 1
    shard.write_bytes(bytes(data))

    after_crash, after_flip = _run([resume_job(spec, str(crashed)), resume_job(spec, str(flipped))])
    for resumed in (after_crash, after_flip):
        assert resumed["resumed_from"].endswith("step-00000002"), resumed
        assert resumed["losses"] == whole["losses"][2:]
    assert any(f"{STEP4} skipped: no manifest.json" in line for line in after_crash["warnings"])
    skipped = [line for line in after_flip["warnings"] if f"{STEP4} skipped" in line]
    assert skipped and "__1_0.distcp at" in skipped[0] and "does not match its sha256 (corrupt)" in skipped[0]
    assert "(rank 1)" in skipped[0] or "rank 1:" in skipped[0], skipped
