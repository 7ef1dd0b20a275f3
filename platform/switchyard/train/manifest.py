"""`manifest.json`, the last file of a checkpoint folder: what the trainer saved, checked whole
when it is read.

Every later step of a resume indexes it (sizes, digests, item ranges, the saving world size),
on every rank. A manifest of another shape, edited by hand or damaged in the store, is refused
here by the field that is wrong, so the folder is skipped as a whole and the older checkpoint
resumed, instead of a `KeyError` or `TypeError` on one rank leaving the others in a collective.
Unknown keys are kept: a newer trainer may add some.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeInt,
    PositiveInt,
    ValidationError,
    model_validator,
)

MANIFEST = "manifest.json"
FileTable = dict[str, dict[str, Any]]

Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _inside_the_folder(relpath: str) -> str:
    # Manifest names become local paths (a download into the cache): never above the folder.
    path = PurePosixPath(relpath)
    if not relpath or path.is_absolute() or ".." in path.parts or "\\" in relpath:
        raise ValueError(f"{relpath!r} is not a path inside the checkpoint folder")
    return relpath


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # strict: True is not a size of 1


class StoredFile(_Strict):
    size: NonNegativeInt
    sha256: Sha256
    chunks: list[tuple[NonNegativeInt, NonNegativeInt, Sha256]] = []
    """Each DCP item stored in it: offset, length, its own sha256."""

    @model_validator(mode="after")
    def _items_inside(self) -> StoredFile:
        for offset, length, _ in self.chunks:
            if offset + length > self.size:
                raise ValueError(f"an item of {length} bytes at {offset} ends past the file's {self.size} bytes")
        return self


class Manifest(_Strict):
    format: Literal["dcp", "deepspeed"]
    step: NonNegativeInt
    files: dict[Annotated[str, AfterValidator(_inside_the_folder)], StoredFile]
    world_size: PositiveInt | None = None
    """The ranks that saved it; absent in manifests written before it was recorded."""


class ManifestError(ValueError):
    """A `manifest.json` that is not the trainer's: the message names what is wrong."""


def build_manifest(files: FileTable, *, step: int, fmt: str, **extra: Any) -> dict[str, Any]:
    return {"format": fmt, "step": step, "files": files, **extra}


def _where(error: Any) -> str:
    return "/".join(str(part) for part in error["loc"]) or "the whole file"


def read_manifest(raw: bytes, step: int | None) -> dict[str, Any]:
    """The parsed manifest of a folder (of checkpoint `step`, when its name says), every field
    the trainer reads checked; raises `ManifestError` naming the first problem."""
    try:
        doc = json.loads(raw)
    except ValueError as exc:  # not UTF-8, or not JSON
        raise ManifestError(f"unreadable manifest.json ({exc})") from None
    try:
        # From the JSON text, so strict typing reads a JSON array as an item's tuple.
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise ManifestError(f"manifest.json: {_where(first)}: {first['msg']}{more}") from None
    if step is not None and manifest.step != step:
        raise ManifestError(f"manifest.json says step {manifest.step}, in the folder of step {step}")
    return dict(doc)
