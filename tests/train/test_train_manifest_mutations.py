"""A checkpoint whose `manifest.json` was changed is skipped by name or read as saved.

Each example saves two checkpoints the way the trainer lays them out (a DCP data file with a
digest per item, DCP's `.metadata`, rank 0's train state; `manifest.json` last), changes one
thing in the newest one's manifest (see `tests/mutations.py`: a key deleted or added, a value
of another type or sign, a size scaled, an item doubled) and then does what a resume does:
rank 0's choice (`newest_complete`, and `latest_valid`, which hashes every file), then one
rank's reads through `CheckpointFiles` (its train state, `.metadata`, its items, a verified
local directory). Each step either gives back exactly the bytes that were saved or raises
`CheckpointError`, which the trainer agrees on across ranks and answers by trying the older
checkpoint. Any other exception is raised on one rank alone, and the others wait in the
collective until it times out. A manifest that is not the trainer's shape is refused when
chosen, naming what is wrong, so the older checkpoint is the one resumed.

`make test` runs `examples(200)` changes (about a second); `SWITCHYARD_EXAMPLES_SCALE` runs more.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from switchyard.train.checkpoint import (
    MANIFEST,
    CheckpointError,
    CheckpointFiles,
    CheckpointStore,
    build_manifest,
    file_table,
    step_folder,
)
from tests.examples import examples
from tests.mutations import mutate

DATA = "__0_0.distcp"
STATE = "train-state-rank-00000.pt"
ITEMS = [(0, 256), (256, 512), (768, 256)]
CONTENT = {DATA: bytes(range(256)) * 4, ".metadata": b"dcp metadata", STATE: b"rank 0 train state"}


def _save(root: Path, step: int) -> dict[str, Any]:
    folder = root / step_folder(step)
    folder.mkdir(parents=True)
    for name, data in CONTENT.items():
        (folder / name).write_bytes(data)
    manifest = build_manifest(file_table(folder, {DATA: ITEMS}), step=step, fmt="dcp", world_size=1)
    (folder / MANIFEST).write_text(json.dumps(manifest))
    return manifest


def _resume_reads(ref: Any, cache: Path) -> None:
    """One rank's reads of a chosen checkpoint; every byte returned must be the saved one."""
    files = CheckpointFiles(ref, cache)
    assert ref.step in (2, 4) and ref.format == "dcp" and (ref.world_size is None or ref.world_size >= 1)
    for name in (STATE, ".metadata"):
        try:
            assert files.read(name) == CONTENT[name], f"{name} read as other bytes"
        except CheckpointError:
            event(f"read {name}: CheckpointError")
    try:
        for offset, length, data in files.read_items(DATA, ITEMS):
            assert data == CONTENT[DATA][offset : offset + length], f"item at {offset} read as other bytes"
    except CheckpointError:
        event("read_items: CheckpointError")
    try:
        folder = files.local_dir(files.names)
        for name in files.names:
            assert (folder / name).read_bytes() == CONTENT[name]
    except CheckpointError:
        event("local_dir: CheckpointError")


@settings(max_examples=examples(200), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_a_changed_manifest_is_skipped_by_name_or_read_as_saved(data: st.DataObject) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "ckpt"
        _save(root, 2)
        saved = _save(root, 4)
        doc, change = mutate(copy.deepcopy(saved), data.draw)
        (root / step_folder(4) / MANIFEST).write_text(json.dumps(doc))
        store = CheckpointStore(str(root), Path(tmp) / "cache")
        try:
            choice, rejected = store.newest_complete()
            assert choice is not None, f"{change}: the older checkpoint was passed over too: {rejected}"
            assert all(name == step_folder(4) and problem for name, problem in rejected), rejected
            event(f"chosen: {choice.name}")
            _resume_reads(choice, Path(tmp) / "cache")
            verified = store.latest_valid()
            assert verified is not None and verified.step in (2, 4)
            if verified.step == 4:
                assert verified.manifest["files"] == choice.manifest["files"]
        except CheckpointError as exc:
            raise AssertionError(f"{change}: the older checkpoint is valid, yet: {exc}") from exc
        except AssertionError as exc:
            raise AssertionError(f"{change}: {exc}") from exc
        except Exception as exc:
            raise AssertionError(f"{change}: {type(exc).__name__}: {exc}") from exc
