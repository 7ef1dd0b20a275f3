"""Checkpoint folders with a manifest; choosing the one to resume from; one rank's reads of it.

Save: every rank writes its part into a private staging directory and records each file's
size and sha256 and, for DCP data files, the sha256 of every item stored in it (`chunks`),
so a rank that reads only some items can verify exactly what it read. The tables are
gathered to rank 0; the files are published (copied into the store, or reported to Ray
Train, which merges the ranks' directories), and rank 0 writes `manifest.json` *last*: a
folder without a manifest is a save that did not finish.

Resume: rank 0 alone picks the newest folder whose manifest parses and whose listed files
are all stored with their sizes (`newest_complete`: one listing, nothing hashed), and the
trainer broadcasts the choice. Each rank then reads only what it needs through
`CheckpointFiles` — its own train state, DCP's `.metadata` and the items its shards need,
straight from the store — verifying every byte against the manifest as it reads it. A
problem on any rank is agreed by all (`agreed`), the folder is skipped with a log line
naming what is wrong, and the next one is tried; if checkpoints exist but none is usable the
job fails instead of silently starting over. `latest_valid` is the whole check in one
process (every file hashed), for tools and tests.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Protocol, TypeVar, cast, runtime_checkable

import torch.distributed as dist

from switchyard.train.job_errors import JobInputError
from switchyard.train.manifest import MANIFEST, FileTable, ManifestError, build_manifest, read_manifest
from switchyard.train.storage import Location

__all__ = ["MANIFEST", "FileTable", "build_manifest"]  # also the trainer's, read here

log = logging.getLogger(__name__)
ItemRanges = dict[str, list[tuple[int, int]]]
"""Per file, the (offset, length) of every item stored in it (DCP's storage layout)."""
Rejection = tuple[str, str]
"""A checkpoint folder passed over, and why."""
READ_RUN_BYTES = 64 << 20
"""Adjacent items of one file are fetched in one read of up to this many bytes."""
_BLOCK = 1 << 20
T = TypeVar("T")


class CheckpointError(JobInputError, RuntimeError):
    """No usable checkpoint where one was expected."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(_BLOCK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _feed(f: IO[bytes], count: int, *digests: Any) -> None:
    while count > 0:
        block = f.read(min(count, _BLOCK))
        if not block:
            raise RuntimeError(f"{f.name}: ends before a stored item does")
        for digest in digests:
            digest.update(block)
        count -= len(block)


def _file_entry(path: Path, ranges: list[tuple[int, int]]) -> dict[str, Any]:
    """Size and sha256 of a file and, when given its items' ranges, each item's sha256: one pass."""
    whole = hashlib.sha256()
    chunks: list[list[Any]] = []
    with path.open("rb") as f:
        for offset, length in sorted(ranges):
            _feed(f, offset - f.tell(), whole)
            item = hashlib.sha256()
            _feed(f, length, whole, item)
            chunks.append([offset, length, item.hexdigest()])
        for block in iter(lambda: f.read(_BLOCK), b""):
            whole.update(block)
    entry: dict[str, Any] = {"size": path.stat().st_size, "sha256": whole.hexdigest()}
    if chunks:
        entry["chunks"] = chunks
    return entry


def file_table(directory: Path, items: ItemRanges | None = None) -> FileTable:
    """Every file under `directory`; files named in `items` also get a digest per item."""
    items = items or {}
    return {
        str(p.relative_to(directory)): _file_entry(p, items.get(str(p.relative_to(directory)), []))
        for p in sorted(directory.rglob("*"))
        if p.is_file()
    }


STEP_PREFIX = "step-"


def step_folder(step: int) -> str:
    return f"{STEP_PREFIX}{step:08d}"


def folder_step(name: str) -> int | None:
    """The step a `step-N` folder's name says; None for any other name."""
    digits = name.removeprefix(STEP_PREFIX)
    return int(digits) if name.startswith(STEP_PREFIX) and digits.isdigit() else None


@dataclass(frozen=True)
class CheckpointRef:
    uri: str
    name: str
    step: int
    manifest: dict[str, Any]

    @property
    def format(self) -> str:
        return str(self.manifest["format"])

    @property
    def world_size(self) -> int | None:
        """The ranks that saved it; None for a manifest written before it was recorded."""
        saved = self.manifest.get("world_size")
        return None if saved is None else int(saved)


def gather_file_tables(own: FileTable, group: Any = None) -> FileTable:
    """Merge every rank's files; two ranks writing the same name is a bug, not a merge."""
    tables: list[FileTable] = [own]
    if dist.is_initialized():
        tables = [{} for _ in range(dist.get_world_size(group))]
        dist.all_gather_object(tables, own, group=group)
    merged: FileTable = {}
    for rank, table in enumerate(tables):
        for name, entry in table.items():
            if name in merged:
                raise RuntimeError(f"checkpoint file {name!r} written by rank {rank} and another")
            merged[name] = entry
    return merged


def _is_storage_error(exc: Exception) -> bool:
    # botocore's by module: only S3 users pay for importing it.
    return isinstance(exc, OSError) or type(exc).__module__.split(".")[0] in ("botocore", "boto3", "s3transfer")


@contextmanager
def _store_read(uri: str) -> Iterator[None]:
    """A store that cannot be listed or read (no credentials, no such bucket, no network, no
    permission) is a `CheckpointError` naming it: raised on rank 0 while it chooses, it reaches
    every rank as one, and the launcher prints one line (it was a botocore traceback in torch's
    spawn error, or Ray's)."""
    try:
        yield
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        raise CheckpointError(f"the checkpoint store {uri} cannot be read: {type(exc).__name__}: {exc}") from None


def none_valid(uri: str, rejected: list[Rejection]) -> CheckpointError:
    return CheckpointError(
        f"{len(rejected)} checkpoint(s) under {uri} and none is valid: "
        + "; ".join(f"{name}: {problem}" for name, problem in rejected)
        + ". Delete them, or set checkpoint.resume: false to train from scratch."
    )


def agreed(read: Callable[[], T], group: Any = None) -> T:
    """`read()` on every rank; if it raised `CheckpointError` on any rank, every rank raises
    one naming each problem, so all ranks take the same path (a collective)."""
    problem: str | None = None
    value: T | None = None
    try:
        value = read()
    except CheckpointError as exc:
        problem = str(exc)
    problems = [problem]
    if dist.is_initialized():
        problems = [None] * dist.get_world_size(group)
        dist.all_gather_object(problems, problem, group=group)
    by_problem: dict[str, list[int]] = {}
    for rank, p in enumerate(problems):
        if p is not None:
            by_problem.setdefault(p, []).append(rank)
    if by_problem:
        raise CheckpointError("; ".join(f"{p} (rank {', '.join(map(str, ranks))})" for p, ranks in by_problem.items()))
    return cast(T, value)


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
            manifest = read_manifest(raw, folder_step(name))
        except ManifestError as exc:
            return None, str(exc)
        files: FileTable = manifest["files"]
        sizes = self.location.file_sizes(name)
        for relpath, entry in files.items():
            if relpath not in sizes:
                return manifest, f"missing file {relpath}"
            if sizes[relpath] != entry["size"]:
                return manifest, f"{relpath} has {sizes[relpath]} bytes, manifest says {entry['size']}"
        return manifest, None

    def _rejected(self, name: str, problem: str) -> Rejection:
        log.warning("checkpoint %s skipped: %s", self.location.child_uri(name), problem)
        return name, problem

    def candidates(self) -> list[str]:
        # Only `step-N` folders: the run directory also holds `tensorboard/` (metrics_log).
        return [n for n in self.location.list_children() if n.startswith(STEP_PREFIX)]

    def newest_complete(self, exclude: Collection[str] = ()) -> tuple[CheckpointRef | None, list[Rejection]]:
        """Rank 0's choice: the newest folder not in `exclude` whose manifest parses and
        whose listed files are all stored with their sizes (its manifest and one listing are
        read; nothing is hashed: each rank verifies what it reads). Also the folders passed
        over on the way, each logged."""
        rejected: list[Rejection] = []
        with _store_read(self.uri):
            names = sorted(self.candidates(), reverse=True)  # zero-padded steps sort by name
        for name in names:
            if name in exclude:
                continue
            with _store_read(self.uri):
                manifest, problem = self._problem(name)
            if problem is None and manifest is not None:
                ref = CheckpointRef(self.location.child_uri(name), name, int(manifest["step"]), manifest)
                return ref, rejected
            rejected.append(self._rejected(name, str(problem)))
        return None, rejected

    def _hash_problem(self, ref: CheckpointRef) -> str | None:
        for relpath, entry in ref.manifest["files"].items():
            digest = hashlib.sha256()
            for block in self.location.stream(ref.name, relpath):
                digest.update(block)
            if digest.hexdigest() != entry["sha256"]:
                return f"{relpath} does not match its sha256 (corrupt)"
        return None

    def latest_valid(self) -> CheckpointRef | None:
        """The newest checkpoint that passes every check, every file hashed whole (streamed,
        never copied): one process reads the whole checkpoint. For tools and tests; the
        trainer uses `newest_complete` and `CheckpointFiles`. None only when the store holds
        no checkpoints."""
        judged: list[Rejection] = []
        while True:
            ref, rejected = self.newest_complete(exclude={name for name, _ in judged})
            judged += rejected
            if ref is None:
                break
            problem = self._hash_problem(ref)
            if problem is None:
                return ref
            judged.append(self._rejected(ref.name, problem))
        if judged:
            raise none_valid(self.uri, judged)
        return None

    def open(self, name: str) -> CheckpointRef:
        """One named checkpoint whose manifest and file sizes check out (for `init_from`);
        its contents are verified as they are read (`CheckpointFiles`)."""
        with _store_read(self.uri):
            manifest, problem = self._problem(name)
        if problem is None and manifest is not None:
            return CheckpointRef(self.location.child_uri(name), name, int(manifest["step"]), manifest)
        raise CheckpointError(f"checkpoint {self.location.child_uri(name)} is not usable: {problem}")

    def verified(self, name: str) -> CheckpointRef:
        """Folder `name` once every check passed and every file was hashed whole (for a
        process that loads a whole checkpoint itself: the local model); raises
        `CheckpointError` naming what is wrong."""
        ref = self.open(name)
        problem = self._hash_problem(ref)
        if problem is not None:
            raise CheckpointError(f"checkpoint {ref.uri} is not usable: {problem}")
        return ref

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


def _runs(ranges: list[tuple[int, int]], limit: int) -> Iterator[list[tuple[int, int]]]:
    """Sorted, distinct ranges grouped into runs of back-to-back ranges of at most `limit`
    bytes in all (a larger range is a run of its own)."""
    run: list[tuple[int, int]] = []
    for offset, length in ranges:
        if run and (offset != run[-1][0] + run[-1][1] or offset + length - run[0][0] > limit):
            yield run
            run = []
        run.append((offset, length))
    if run:
        yield run


class CheckpointFiles:
    """One rank's reads of one checkpoint: only the files or items it asks for, each
    verified against the manifest as it is read, straight from the store (S3: ranged GETs;
    a local copy only for `local_dir`). No rank reads or hashes what it does not load."""

    def __init__(self, ref: CheckpointRef, cache_dir: Path) -> None:
        self.location = Location(ref.uri.rpartition("/")[0])
        self.ref = ref
        self.cache_dir = cache_dir / ref.name
        """Where files from S3 go for `local_dir`."""
        self._verified: set[str] = set()

    @property
    def names(self) -> list[str]:
        return sorted(self.ref.manifest["files"])

    def _entry(self, relpath: str) -> dict[str, Any]:
        entry: dict[str, Any] | None = self.ref.manifest["files"].get(relpath)
        if entry is None:
            raise CheckpointError(f"{relpath} is not in manifest.json")
        return entry

    def _check(self, data: bytes, expected: str, what: str) -> bytes:
        if hashlib.sha256(data).hexdigest() != expected:
            raise CheckpointError(f"{what} does not match its sha256 (corrupt)")
        return data

    def read(self, relpath: str) -> bytes:
        """One whole file (small ones: train state, DCP's `.metadata`), verified."""
        entry = self._entry(relpath)
        data = self.location.read_range(self.ref.name, relpath, 0, int(entry["size"]))
        return self._check(data, entry["sha256"], relpath)

    def read_items(self, relpath: str, ranges: Collection[tuple[int, int]]) -> Iterator[tuple[int, int, bytes]]:
        """The items at these (offset, length) ranges of one file, as (offset, length, bytes),
        adjacent ones fetched together; each is checked against its own digest. A manifest
        without item digests (written before them) makes this rank verify the whole file once."""
        entry = self._entry(relpath)
        digests = {(int(o), int(n)): d for o, n, d in entry.get("chunks", [])}
        if not digests:
            path = self.local_dir([relpath]) / relpath
            with path.open("rb") as f:
                for offset, length in sorted(set(ranges)):
                    f.seek(offset)
                    yield offset, length, f.read(length)
            return
        for run in _runs(sorted(set(ranges)), READ_RUN_BYTES):
            start = run[0][0]
            data = self.location.read_range(self.ref.name, relpath, start, run[-1][0] + run[-1][1] - start)
            for offset, length in run:
                digest = digests.get((offset, length))
                if digest is None:
                    raise CheckpointError(f"{relpath}: manifest.json lists no item of {length} bytes at {offset}")
                piece = data[offset - start : offset - start + length]
                yield offset, length, self._check(piece, digest, f"{relpath} at {offset} ({length} bytes)")

    def local_dir(self, relpaths: Collection[str]) -> Path:
        """A local directory holding these files, each verified whole once (for loaders that
        open files by path: DeepSpeed). A local store's folder is used in place; from S3 only
        these files are downloaded."""
        for relpath in relpaths:
            if relpath in self._verified:
                continue
            entry = self._entry(relpath)
            path = self.location.local_path(self.ref.name, relpath, self.cache_dir)
            if path.stat().st_size != entry["size"] or sha256_file(path) != entry["sha256"]:
                raise CheckpointError(f"{relpath} does not match its sha256 (corrupt)")
            self._verified.add(relpath)
        return self.cache_dir if self.location.is_s3 else Path(self.location.uri) / self.ref.name


@runtime_checkable
class ShardedCheckpointing(Protocol):
    """An engine whose checkpoint is DCP's (`TorchEngine`): it says where each saved item
    lies (each gets its own digest), can save in the background, and resumes by reading only
    the items its own shards need, straight from the store."""

    def save_items(self, directory: Path) -> ItemRanges:
        """`TrainEngine.save`, returning where each item went."""
        ...

    def start_save(self, directory: Path, group: Any) -> Future[ItemRanges]:
        """Returns once the state is staged in host memory (training may go on); the future
        is done once the files are written. `group` runs the save's collectives (gloo)."""
        ...

    def load_items(self, files: CheckpointFiles) -> None: ...


@runtime_checkable
class NamedFileLoading(Protocol):
    """An engine whose loader opens files by path (`DeepSpeedEngine`) and can name the ones
    this rank opens; the others are neither fetched nor hashed."""

    def checkpoint_files(self, names: list[str]) -> set[str]: ...


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
