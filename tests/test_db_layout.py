"""Which database each store uses, and the layouts that are refused with the setting to change."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.db.engine import redacted
from switchyard.db.location import (
    DATABASE_URL_ENV,
    LEDGER_URL_ENV,
    Store,
    UnsafeLayout,
    check_layout,
    filesystem_type,
    require_same_state,
    shared_url,
    state_identity,
    store_url,
)

PG = "postgresql://switchyard:s3cret@db.internal:5432/switchyard"

MOUNTS = """\
22 1 259:1 / / rw,relatime shared:1 - ext4 /dev/nvme0n1p1 rw
35 22 0:40 / /mnt/shared rw,relatime shared:20 - nfs4 fs:/export rw,vers=4.2
36 35 0:41 / /mnt/shared/local rw,relatime shared:21 - ext4 /dev/sdb1 rw
37 22 0:42 / /mnt/fuse rw,relatime shared:22 - fuse.s3fs s3fs rw
"""


def test_without_a_url_each_store_is_a_file_in_the_state_dir(tmp_path: Path) -> None:
    assert store_url(tmp_path, Store.KEYS, {}) == f"sqlite:///{tmp_path}/keys.db"
    assert store_url(tmp_path, Store.SUBJECT_KEYS, {}) == f"sqlite:///{tmp_path}/audit/keys.db"


def test_one_url_moves_every_store_and_the_ledger_url_still_wins_for_the_ledger(tmp_path: Path) -> None:
    env = {DATABASE_URL_ENV: PG}
    assert {store_url(tmp_path, s, env) for s in Store} == {PG}
    env[LEDGER_URL_ENV] = "postgresql://other/ledger"
    assert store_url(tmp_path, Store.LEDGER, env) == "postgresql://other/ledger"
    assert store_url(tmp_path, Store.AUDIT, env) == PG


def test_a_sqlite_url_for_all_stores_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match=f"{DATABASE_URL_ENV}=sqlite:///x.db: expected postgresql://"):
        shared_url({DATABASE_URL_ENV: "sqlite:///x.db"})


def test_passwords_never_reach_a_message() -> None:
    assert redacted(PG) == "postgresql://switchyard@db.internal:5432/switchyard"
    assert "s3cret" not in state_identity(Path("/x"), {DATABASE_URL_ENV: PG})


def test_the_filesystem_is_the_longest_mount_above_the_path(tmp_path: Path) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTS)
    assert filesystem_type(Path("/mnt/shared/state"), table) == "nfs4"
    assert filesystem_type(Path("/mnt/shared/local/state"), table) == "ext4"
    assert filesystem_type(Path("/mnt/sharedother"), table) == "ext4"  # a prefix of a name is not a parent
    assert filesystem_type(Path("/mnt/fuse/x"), table) == "fuse.s3fs"


def test_sqlite_on_a_network_filesystem_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = tmp_path / "mountinfo"
    table.write_text(MOUNTS)
    monkeypatch.setattr("switchyard.db.location.filesystem_type", lambda path: filesystem_type(path, table))
    with pytest.raises(UnsafeLayout, match=f"network filesystem \\(nfs4\\).*{DATABASE_URL_ENV}"):
        check_layout(Path("/mnt/shared/state"), hosts=1, env={})
    check_layout(Path("/mnt/shared/local/state"), hosts=1, env={})
    check_layout(Path("/mnt/shared/state"), hosts=1, env={DATABASE_URL_ENV: PG})  # nothing shared on it


def test_sqlite_on_a_cluster_of_several_hosts_is_refused(tmp_path: Path) -> None:
    with pytest.raises(UnsafeLayout, match=f"on 3 hosts.*Set {DATABASE_URL_ENV}"):
        check_layout(tmp_path, hosts=3, env={})
    check_layout(tmp_path, hosts=1, env={})
    check_layout(tmp_path, hosts=3, env={DATABASE_URL_ENV: PG})


def test_a_replica_whose_state_is_not_the_heads_is_refused(tmp_path: Path) -> None:
    head = state_identity(tmp_path / "head", {})
    require_same_state(head, tmp_path / "head", {})
    with pytest.raises(UnsafeLayout, match=f"local to one host and one state directory.*{DATABASE_URL_ENV}"):
        require_same_state(head, tmp_path / "node-b", {})  # a node with its own state directory
    shared = state_identity(tmp_path / "head", {DATABASE_URL_ENV: PG})
    require_same_state(shared, tmp_path / "node-b", {DATABASE_URL_ENV: PG})
    with pytest.raises(UnsafeLayout):
        require_same_state(shared, tmp_path / "node-b", {})  # a node that was not given the URL
