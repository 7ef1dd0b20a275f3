"""Files under a local directory or an `s3://bucket/prefix`, behind one small interface.

S3 goes through boto3; the endpoint comes from boto3's own configuration (e.g.
`AWS_ENDPOINT_URL`), which is how tests point it at a local moto server. Reads can be
byte ranges (`read_range`: one ranged GET on S3), so a rank fetches only the part of a
file it needs.
"""

from __future__ import annotations

import shutil
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

S3_SCHEME = "s3://"
_STREAM_BYTES = 1 << 20
_CLIENT_LOCK = threading.Lock()
"""boto3's default session is not thread-safe while it creates clients, and checkpoints
are committed from a background thread (`switchyard.train.loop`)."""


def is_s3_uri(uri: str) -> bool:
    return uri.startswith(S3_SCHEME)


def split_s3_uri(uri: str) -> tuple[str, str]:
    """`s3://bucket/a/b` -> (`bucket`, `a/b`)."""
    if not is_s3_uri(uri):
        raise ValueError(f"not an s3:// URI: {uri!r}")
    bucket, _, key = uri[len(S3_SCHEME) :].partition("/")
    if not bucket:
        raise ValueError(f"s3 URI without a bucket: {uri!r}")
    return bucket, key.strip("/")


def _client() -> Any:
    import boto3  # imported here: only S3 users pay for boto3's import time

    with _CLIENT_LOCK:
        return boto3.client("s3")


def _is_directory_marker(key: str) -> bool:
    """An empty `dir/` object: what pyarrow's S3 filesystem (Ray Train's uploads) writes for a
    directory. Not a file: downloading it would put a file where the directory must go."""
    return key.endswith("/")


def _join(*parts: str) -> str:
    return "/".join(p.strip("/") for p in parts if p.strip("/"))


class Location:
    """A root directory, local or S3, holding named children (checkpoint folders)."""

    def __init__(self, uri: str) -> None:
        self.uri = uri.rstrip("/")
        self.is_s3 = is_s3_uri(uri)

    def child_uri(self, name: str) -> str:
        return f"{self.uri}/{name}"

    def list_children(self) -> list[str]:
        if not self.is_s3:
            root = Path(self.uri)
            return sorted(p.name for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        bucket, prefix = split_s3_uri(self.uri)
        names: set[str] = set()
        paginator = _client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=_join(prefix) + "/", Delimiter="/"):
            for common in page.get("CommonPrefixes", []):
                names.add(common["Prefix"].rstrip("/").rsplit("/", 1)[-1])
        return sorted(names)

    def file_sizes(self, name: str) -> dict[str, int]:
        """Relative path -> size of every file under child `name`."""
        if not self.is_s3:
            root = Path(self.uri) / name
            return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}
        bucket, prefix = split_s3_uri(self.child_uri(name))
        sizes: dict[str, int] = {}
        paginator = _client().get_paginator("list_objects_v2")
        for page in paginator.paginate(Bucket=bucket, Prefix=prefix + "/"):
            for obj in page.get("Contents", []):
                if not _is_directory_marker(obj["Key"]):
                    sizes[obj["Key"][len(prefix) + 1 :]] = int(obj["Size"])
        return sizes

    def read_bytes(self, name: str, relpath: str) -> bytes | None:
        if not self.is_s3:
            path = Path(self.uri) / name / relpath
            return path.read_bytes() if path.is_file() else None
        bucket, key = split_s3_uri(self.child_uri(name))
        client = _client()
        try:
            body: bytes = client.get_object(Bucket=bucket, Key=_join(key, relpath))["Body"].read()
        except client.exceptions.NoSuchKey:
            return None
        return body

    def read_range(self, name: str, relpath: str, offset: int, length: int) -> bytes:
        """`length` bytes of one file from `offset`; fewer only where the file is shorter."""
        if length <= 0:
            return b""
        if not self.is_s3:
            with (Path(self.uri) / name / relpath).open("rb") as f:
                f.seek(offset)
                return f.read(length)
        bucket, key = split_s3_uri(self.child_uri(name))
        response = _client().get_object(
            Bucket=bucket, Key=_join(key, relpath), Range=f"bytes={offset}-{offset + length - 1}"
        )
        body: bytes = response["Body"].read()
        return body

    def stream(self, name: str, relpath: str) -> Iterator[bytes]:
        """One file's bytes in blocks, without a local copy."""
        if not self.is_s3:
            with (Path(self.uri) / name / relpath).open("rb") as f:
                yield from iter(lambda: f.read(_STREAM_BYTES), b"")
            return
        bucket, key = split_s3_uri(self.child_uri(name))
        body = _client().get_object(Bucket=bucket, Key=_join(key, relpath))["Body"]
        yield from body.iter_chunks(_STREAM_BYTES)

    def local_path(self, name: str, relpath: str, cache_dir: Path) -> Path:
        """A local path of one file: in place when local, else downloaded into `cache_dir`."""
        if not self.is_s3:
            return Path(self.uri) / name / relpath
        bucket, key = split_s3_uri(self.child_uri(name))
        dest = cache_dir / relpath
        dest.parent.mkdir(parents=True, exist_ok=True)
        _client().download_file(bucket, _join(key, relpath), str(dest))
        return dest

    def put_file(self, name: str, relpath: str, local: Path) -> None:
        if not self.is_s3:
            dest = Path(self.uri) / name / relpath
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            shutil.copyfile(local, tmp)
            tmp.replace(dest)  # a reader never sees a half-written file under its final name
            return
        bucket, key = split_s3_uri(self.child_uri(name))
        _client().upload_file(str(local), bucket, _join(key, relpath))

    def fetch(self, name: str, dest: Path) -> Path:
        """A local directory with child `name`'s files (the directory itself when local)."""
        if not self.is_s3:
            return Path(self.uri) / name
        return download_prefix(self.child_uri(name), dest)

    def delete(self, name: str) -> None:
        if not self.is_s3:
            shutil.rmtree(Path(self.uri) / name, ignore_errors=False)
            return
        bucket, prefix = split_s3_uri(self.child_uri(name))
        client = _client()
        for relpath in self.file_sizes(name):
            client.delete_object(Bucket=bucket, Key=_join(prefix, relpath))


def download_prefix(uri: str, dest: Path) -> Path:
    """Copy every object under `uri` into `dest` (skipping files already there, same size)."""
    bucket, prefix = split_s3_uri(uri)
    client = _client()
    paginator = client.get_paginator("list_objects_v2")
    found = False
    # A folder, not a string prefix: `s3://b/data` must not also pull `s3://b/data2/...`.
    folder = _join(prefix) + "/" if _join(prefix) else ""
    for page in paginator.paginate(Bucket=bucket, Prefix=folder):
        for obj in page.get("Contents", []):
            found = True
            if _is_directory_marker(obj["Key"]):
                continue
            rel = obj["Key"][len(folder) :].lstrip("/")
            target = dest / rel
            if target.is_file() and target.stat().st_size == obj["Size"]:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, obj["Key"], str(target))
    if not found:
        raise FileNotFoundError(f"nothing under {uri}")
    return dest
