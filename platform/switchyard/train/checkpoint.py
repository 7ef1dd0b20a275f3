"""Checkpoint folders with a manifest, and finding the latest one that is complete.

Every rank writes its part into a private staging directory, hashes its files, and the
hashes are gathered to rank 0. The files are then published (copied into the store, or
reported to Ray Train, which merges the ranks' directories), and rank 0 writes
`manifest.json` *last*: a folder without a manifest is a save that did not finish. On
resume each candidate is checked newest first (manifest present, every listed file present
with its size and sha256); a bad one is skipped with a log line naming what is wrong, and if
checkpoints exist but none is valid the job fails instead of silently starting over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from switchyard.train.storage import Location

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
FileTable = dict[str, dict[str, Any]]


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def file_table(directory: Path) -> FileTable:
    return {
        str(p.relative_to(directory)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


STEP_PREFIX = "step-"


def step_folder(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


@dataclass(frozen=True)
class CheckpointRef:
    uri: str
    name: str
    step: int
    manifest: dict[str, Any]
    local_dir: Path

    @property
    def format(self) -> str:
        return str(self.manifest["format"])


def gather_file_tables(own: FileTable) -> FileTable:
    """Merge every rank's files; two ranks writing the same name is a bug, not a merge."""
    tables: list[FileTable] = [own]
    if dist.is_initialized():
        tables = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(tables, own)
    merged: FileTable = {}
    for rank, table in enumerate(tables):
        for name, entry in table.items():
            if name in merged:
                raise RuntimeError(f"checkpoint file {name!r} written by rank {rank} and another")
            merged[name] = entry
    return merged


def build_manifest(files: FileTable, *, step: int, fmt: str, **extra: Any) -> dict[str, Any]:
    return {"format": fmt, "step": step, "files": files, **extra}


class CheckpointStore:
    """The checkpoint folders under one root (local directory or s3:// prefix)."""

    def __init__(self, uri: str, cache_dir: Path) -> None:
        self.location = Location(uri)
        self.cache_dir = cache_dir

    @property
    def uri(self) -> str:
        return self.location.uri

    def publish(
        self, name: str, rank_dir: Path, own: FileTable, manifest: dict[str, Any] | None, barrier: Callable[[], None]
    ) -> None:
        """Copy this rank's files into folder `name`; after every rank has, rank 0 (the one
        holding `manifest`) writes the manifest."""
        for relpath in own:
            self.location.put_file(name, relpath, rank_dir / relpath)
        barrier()
        if manifest is not None:
            self.put_manifest(name, rank_dir, manifest)
        barrier()

    def put_manifest(self, name: str, rank_dir: Path, manifest: dict[str, Any]) -> None:
        """Mark folder `name` complete: only once every file the manifest lists is stored."""
        manifest_path = rank_dir / MANIFEST
        manifest_path.write_text(json.dumps(manifest, indent=1, sort_keys=True))
        self.location.put_file(name, MANIFEST, manifest_path)

    def _problem(self, name: str) -> tuple[dict[str, Any] | None, str | None]:
        raw = self.location.read_bytes(name, MANIFEST)
        if raw is None:
            return None, "no manifest.json (the save did not finish)"
        try:
            manifest: dict[str, Any] = json.loads(raw)
            files: FileTable = manifest["files"]
            int(manifest["step"])
        except (ValueError, KeyError, TypeError) as exc:
            return None, f"unreadable manifest.json ({exc!r})"
        sizes = self.location.file_sizes(name)
        for relpath, entry in files.items():
            if relpath not in sizes:
                return manifest, f"missing file {relpath}"
            if sizes[relpath] != entry["size"]:
                return manifest, f"{relpath} has {sizes[relpath]} bytes, manifest says {entry['size']}"
        return manifest, None

    def _verify_hashes(self, local: Path, manifest: dict[str, Any]) -> str | None:
        for relpath, entry in manifest["files"].items():
            if sha256_file(local / relpath) != entry["sha256"]:
                return f"{relpath} does not match its sha256 (corrupt)"
        return None

    def candidates(self) -> list[str]:
        # Only `step-N` folders: the run directory also holds `tensorboard/` (metrics_log).
        return [n for n in self.location.list_children() if n.startswith(STEP_PREFIX)]

    def latest_valid(self) -> CheckpointRef | None:
        """The newest complete checkpoint; None only when the store holds no checkpoints."""
        names = self.candidates()
        checked: list[tuple[int, str, dict[str, Any]]] = []
        rejected: list[str] = []
        for name in names:
            manifest, problem = self._problem(name)
            if problem is not None or manifest is None:
                log.warning("checkpoint %s skipped: %s", self.location.child_uri(name), problem)
                rejected.append(f"{name}: {problem}")
                continue
            checked.append((int(manifest["step"]), name, manifest))
        for step, name, manifest in sorted(checked, reverse=True):
            local = self.location.fetch(name, self.cache_dir / name)
            problem = self._verify_hashes(local, manifest)
            if problem is not None:
                log.warning("checkpoint %s skipped: %s", self.location.child_uri(name), problem)
                rejected.append(f"{name}: {problem}")
                continue
            return CheckpointRef(self.location.child_uri(name), name, step, manifest, local)
        if rejected:
            raise CheckpointError(
                f"{len(rejected)} checkpoint(s) under {self.uri} and none is valid: "
                + "; ".join(rejected)
                + ". Delete them, or set checkpoint.resume: false to train from scratch."
            )
        return None

    def open(self, name: str) -> CheckpointRef:
        """One named checkpoint, validated (for `init_from`)."""
        manifest, problem = self._problem(name)
        if problem is None and manifest is not None:
            local = self.location.fetch(name, self.cache_dir / name)
            problem = self._verify_hashes(local, manifest)
            if problem is None:
                step = int(manifest["step"])
                return CheckpointRef(self.location.child_uri(name), name, step, manifest, local)
        raise CheckpointError(f"checkpoint {self.location.child_uri(name)} is not usable: {problem}")

    def prune(self, keep: int) -> list[str]:
        """Delete all but the newest `keep` complete checkpoints; returns the deleted names."""
        complete = []
        for name in self.candidates():
            manifest, problem = self._problem(name)
            if manifest is not None and problem is None:
                complete.append((int(manifest["step"]), name))
        doomed = [name for _, name in sorted(complete, reverse=True)[keep:]]
        for name in doomed:
            self.location.delete(name)
        return doomed


def open_checkpoint(uri: str, cache_dir: Path) -> CheckpointRef:
    """A checkpoint folder by its full URI (parent store + folder name)."""
    parent, _, name = uri.rstrip("/").rpartition("/")
    if not name:
        raise CheckpointError(f"not a checkpoint folder URI: {uri!r}")
    return CheckpointStore(parent, cache_dir).open(name)


def clean_dir(path: Path) -> Path:
    shutil.rmtree(path, ignore_errors=True)
    path.mkdir(parents=True)
    return path
