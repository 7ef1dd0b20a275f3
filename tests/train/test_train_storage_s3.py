"""S3 folders as Ray Train leaves them: pyarrow's S3 filesystem writes an empty `dir/` object
for each directory it creates, next to the files."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.train.storage import Location, download_prefix


def test_directory_markers_are_not_files(s3_bucket: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    for key, body in [
        ("run/step-2/", b""),
        ("run/step-2/a.pt", b"abc"),
        ("run/step-2/sub/", b""),
        ("run/step-2/sub/b.pt", b"de"),
    ]:
        client.put_object(Bucket="ckpt", Key=key, Body=body)
    location = Location(f"{s3_bucket}/run")
    assert location.list_children() == ["step-2"]
    assert location.file_sizes("step-2") == {"a.pt": 3, "sub/b.pt": 2}
    local = location.fetch("step-2", tmp_path / "step-2")
    assert (local / "a.pt").read_bytes() == b"abc" and (local / "sub" / "b.pt").read_bytes() == b"de"
    assert sorted(str(p.relative_to(local)) for p in local.rglob("*") if p.is_file()) == ["a.pt", "sub/b.pt"]


def test_download_prefix_is_a_folder_not_a_string_prefix(s3_bucket: str, tmp_path: Path) -> None:
    import boto3

    client = boto3.client("s3")
    client.put_object(Bucket="ckpt", Key="data/a.bin", Body=b"ab")
    client.put_object(Bucket="ckpt", Key="data2/b.bin", Body=b"cd")
    for uri in (f"{s3_bucket}/data", f"{s3_bucket}/data/"):
        dest = download_prefix(uri, tmp_path / uri.rstrip("/").replace("/", "_").replace(":", ""))
        assert sorted(p.name for p in dest.rglob("*") if p.is_file()) == ["a.bin"], uri
    with pytest.raises(FileNotFoundError, match="nothing under s3://ckpt/dat"):
        download_prefix(f"{s3_bucket}/dat", tmp_path / "dat")  # `data/` and `data2/` are not under `dat/`


def test_byte_ranges_and_streams_read_only_what_is_asked(s3_bucket: str, tmp_path: Path) -> None:
    import boto3

    boto3.client("s3").put_object(Bucket="ckpt", Key="run/step-1/f.bin", Body=bytes(range(100)))
    (tmp_path / "step-1").mkdir()
    (tmp_path / "step-1" / "f.bin").write_bytes(bytes(range(100)))
    for location in (Location(f"{s3_bucket}/run"), Location(str(tmp_path))):
        assert location.read_range("step-1", "f.bin", 10, 5) == bytes(range(10, 15))
        assert location.read_range("step-1", "f.bin", 98, 5) == bytes([98, 99])  # short at the end
        assert b"".join(location.stream("step-1", "f.bin")) == bytes(range(100))
