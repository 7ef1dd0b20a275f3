"""Spawned-group functions for the resume and background-save tests: what each rank reads
from checkpoint storage and hashes while it resumes, and a crash between a background save's
staging and its commit. (Spawned children import this module by name, like `_workers`.)
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import logging
import os
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from switchyard.train.checkpoint import CheckpointStore
from switchyard.train.engine import TrainEngine
from switchyard.train.loop import RunContext, Trainer
from switchyard.train.spec import JobSpec


class Crash(RuntimeError):
    """Raised from `on_step` on every rank: the run fails mid-way (no final save)."""


class StorageReads:
    """Bytes this process reads from checkpoint storage (local files under `root`, or S3
    objects), per file name inside its step folder; bytes it hashes with sha256; S3 listings.
    Counted only while `active`. Implementation-agnostic: it patches `open` and botocore, not
    the code under test."""

    def __init__(self, root: str) -> None:
        self.root = root.rstrip("/")
        self.active = False
        self.read: Counter[str] = Counter()
        self.hashed = 0
        self.listings = 0
        self._undo: list[Callable[[], None]] = []

    def _name(self, path: str) -> str:
        return path.rsplit("/step-", 1)[-1].split("/", 1)[-1]

    def count(self, path: str, n: int) -> None:
        if self.active:
            self.read[self._name(path)] += n

    def install(self) -> StorageReads:
        import botocore.auth  # noqa: F401  (imported first: it binds sha256 for request signing)
        from botocore.client import BaseClient

        real_open = builtins.open

        def counting_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
            f = real_open(file, mode, *args, **kwargs)
            path = os.fspath(file) if isinstance(file, str | os.PathLike) else ""
            if isinstance(path, str) and path.startswith(self.root) and "/step-" in path and set(mode) <= set("rb"):
                return _CountingFile(f, path, self)
            return f

        builtins.open = counting_open
        io.open = counting_open  # pathlib's Path.open calls io.open
        self._undo.append(lambda: setattr(builtins, "open", real_open))
        self._undo.append(lambda: setattr(io, "open", real_open))

        real_sha256 = hashlib.sha256

        def counting_sha256(data: bytes = b"", **kwargs: Any) -> Any:
            digest = _CountingHash(real_sha256(**kwargs), self)
            if data:
                digest.update(data)
            return digest

        hashlib.sha256 = counting_sha256  # type: ignore[assignment]
        self._undo.append(lambda: setattr(hashlib, "sha256", real_sha256))

        real_call = BaseClient._make_api_call

        def counting_call(client: Any, operation: str, params: dict[str, Any]) -> Any:
            response = real_call(client, operation, params)
            if self.active and operation == "ListObjectsV2":
                self.listings += 1
            if operation == "GetObject" and params["Key"].startswith(self.root.split("/", 3)[-1]):
                response["Body"] = _CountingBody(response["Body"], params["Key"], self)
            return response

        BaseClient._make_api_call = counting_call
        self._undo.append(lambda: setattr(BaseClient, "_make_api_call", real_call))
        return self

    def uninstall(self) -> None:
        while self._undo:
            self._undo.pop()()

    def snapshot(self) -> dict[str, Any]:
        return {"read": dict(self.read), "hashed": self.hashed, "listings": self.listings}


class _CountingFile:
    def __init__(self, f: Any, path: str, reads: StorageReads) -> None:
        self._f, self._path, self._reads = f, path, reads

    def read(self, *args: Any) -> Any:
        data = self._f.read(*args)
        self._reads.count(self._path, len(data))
        return data

    def read1(self, *args: Any) -> Any:
        data = self._f.read1(*args)
        self._reads.count(self._path, len(data))
        return data

    def readinto(self, buffer: Any) -> Any:
        n = self._f.readinto(buffer)
        self._reads.count(self._path, n or 0)
        return n

    def readline(self, *args: Any) -> Any:
        data = self._f.readline(*args)
        self._reads.count(self._path, len(data))
        return data

    def __iter__(self) -> Iterator[Any]:
        return iter(self.readline, b"")

    def __enter__(self) -> _CountingFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._f.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._f, name)


class _CountingBody:
    def __init__(self, body: Any, key: str, reads: StorageReads) -> None:
        self._body, self._key, self._reads = body, key, reads

    def read(self, *args: Any, **kwargs: Any) -> Any:
        data = self._body.read(*args, **kwargs)
        self._reads.count(self._key, len(data))
        return data

    def iter_chunks(self, chunk_size: int = 1024) -> Iterator[bytes]:
        return iter(lambda: self.read(chunk_size), b"")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._body, name)


class _CountingHash:
    def __init__(self, digest: Any, reads: StorageReads) -> None:
        self._digest, self._reads = digest, reads

    def update(self, data: Any) -> None:
        if self._reads.active:
            self._reads.hashed += len(memoryview(data).cast("B"))
        self._digest.update(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._digest, name)


class Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def resume_job(
    spec: JobSpec,
    store: str,
    *,
    async_save: bool | None = None,
    crash_after: int | None = None,
    count: bool = False,
) -> dict[str, Any]:
    """One job for `resume_jobs`. `async_save=None` leaves `RunContext`'s default;
    `crash_after` raises `Crash` on every rank after that step; `count` records this rank's
    storage reads and hashing from the start of the run until it has resumed."""
    return {
        "spec": spec.model_dump_json(),
        "store": store,
        "async_save": async_save,
        "crash_after": crash_after,
        "count": count,
    }


def _context(rank: int, world_size: int, entry: dict[str, Any], work: Path, **changes: Any) -> RunContext:
    extra = {} if entry["async_save"] is None else {"async_save": entry["async_save"]}
    return RunContext(
        rank=rank,
        world_size=world_size,
        device=torch.device("cpu"),
        job_id="t",
        store=CheckpointStore(entry["store"], work / "cache"),
        work_dir=work,
        handle_sigterm=False,
        **extra,
        **changes,
    )


def resume_jobs(rank: int, world_size: int, jobs: list[dict[str, Any]], out_path: str) -> None:
    """Run each job in turn; rank 0 writes, per job, the result, losses, the checkpoint
    saves it timed, the warnings it logged, and every rank's storage reads while resuming."""
    results = []
    for entry in jobs:
        spec = JobSpec.model_validate_json(entry["spec"])
        work = Path(tempfile.mkdtemp(prefix=f"sy-resume-{spec.name}-"))
        reads = StorageReads(entry["store"]).install() if entry["count"] else None
        seen: dict[str, Any] = {}

        def on_resume(step: int, uri: str, reads: StorageReads | None = reads, seen: dict[str, Any] = seen) -> None:
            if reads is not None:
                reads.active = False
                seen.update(reads.snapshot())

        def on_step(step: int, engine: TrainEngine, crash_after: int | None = entry["crash_after"]) -> None:
            if step == crash_after:
                raise Crash(f"crash after step {step}")

        warnings = Warnings()
        logging.getLogger("switchyard.train").addHandler(warnings)
        trainer = Trainer(spec, _context(rank, world_size, entry, work, on_step=on_step, on_resume=on_resume))
        outcome: dict[str, Any] = {}
        if reads is not None:
            reads.active = True
        try:
            result = trainer.run()
            outcome = {**json.loads(result.to_json()), "losses": result.losses}
        except Crash:
            outcome = {"status": "crashed", "losses": trainer.losses}
        finally:
            logging.getLogger("switchyard.train").removeHandler(warnings)
            if reads is not None:
                reads.uninstall()
        gathered: list[Any] = [None] * world_size
        torch.distributed.all_gather_object(gathered, seen)
        timings = [t.__dict__ for t in getattr(trainer, "save_timings", [])]
        results.append({**outcome, "reads": gathered, "saves": timings, "warnings": warnings.lines})
    if rank == 0:
        Path(out_path).write_text(json.dumps(results))


def crash_before_commit(
    rank: int, world_size: int, jobs: list[dict[str, Any]], spec_json: str, store: str, out_dir: str
) -> None:
    """`resume_jobs(jobs)` first; then train `spec_json` with background saves every 2 steps,
    the commit of the step-4 save blocking just before it writes the manifest (every rank's
    files are stored by then). Training goes on; after step 5 both ranks record what they
    saw and the processes die (`os._exit`)."""
    out = Path(out_dir)
    resume_jobs(rank, world_size, jobs, str(out / "jobs.json"))
    spec = JobSpec.model_validate_json(spec_json)
    entered = threading.Event()
    real_put = CheckpointStore.put_manifest

    def put_manifest(self: CheckpointStore, name: str, rank_dir: Path, manifest: dict[str, Any]) -> None:
        if name.endswith("00000004"):
            entered.set()
            time.sleep(120)  # the crash comes first
        real_put(self, name, rank_dir, manifest)

    CheckpointStore.put_manifest = put_manifest  # type: ignore[method-assign]
    committed_at: dict[int, bool] = {}

    def on_step(step: int, engine: TrainEngine) -> None:
        committed_at[step] = (Path(store) / "step-00000004" / "manifest.json").exists()
        if step < 5:
            return
        if rank == 0:
            entered.wait(timeout=60)  # rank 0 holds the manifest: the files are all stored
            (out / "manifest-pending").write_text("")
        else:
            deadline = time.monotonic() + 60
            while not (out / "manifest-pending").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
        record = {"steps": sorted(committed_at), "committed_at": committed_at, "manifest_pending": entered.is_set()}
        (out / f"rank{rank}.json").write_text(json.dumps(record))
        os._exit(0)

    entry = resume_job(spec, store)
    Trainer(spec, _context(rank, world_size, entry, out / f"work{rank}", on_step=on_step)).run()
