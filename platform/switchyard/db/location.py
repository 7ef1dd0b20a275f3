"""Which database each store uses, and the layouts that are refused.

One URL configures every shared store: `SWITCHYARD_DATABASE_URL=postgresql://...` puts keys,
audit, subject keys, idempotent answers and the ledger in one Postgres database, which every
node of a cluster reaches. Without it each store is a SQLite file in the state directory
(the embedded default: one host, no server). `SWITCHYARD_LEDGER_URL`, from before the shared
database, still moves the ledger alone and wins for it.

What stays per host whatever the URL: the audit spool and the charge journals (local buffers
that drain into the shared stores), the anchors of the audit chain a host appended, the
copies of published policy sets, and the scheduler's journal (on the head, where its actor
is pinned).

SQLite is refused where it cannot be one source of truth: on a network filesystem (its file
locking is unreliable there; the classic way to corrupt a database), and for a cluster whose
nodes are on more than one host (each host would open its own file).
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from switchyard.db.engine import (
    POSTGRES_PREFIXES,
    SQLITE_PREFIX,
    PostgresDatabase,
    SqliteDatabase,
    open_database,
    redacted,
)

DATABASE_URL_ENV = "SWITCHYARD_DATABASE_URL"
LEDGER_URL_ENV = "SWITCHYARD_LEDGER_URL"


class Store(StrEnum):
    KEYS = "keys"
    AUDIT = "audit"
    SUBJECT_KEYS = "subject_keys"
    IDEMPOTENCY = "idempotency"
    LEDGER = "ledger"


SQLITE_FILES = {
    Store.KEYS: "keys.db",
    Store.AUDIT: "audit/audit.db",
    Store.SUBJECT_KEYS: "audit/keys.db",
    Store.IDEMPOTENCY: "idempotency.db",
    Store.LEDGER: "ledger.db",
}

# Filesystem types (as /proc/self/mountinfo names them) whose byte-range locks SQLite cannot
# trust across hosts.
NETWORK_FILESYSTEMS = frozenset(
    {"nfs", "nfs4", "cifs", "smb3", "smbfs", "9p", "ceph", "glusterfs", "lustre", "gpfs", "afs", "beegfs", "orangefs"}
)


class UnsafeLayout(Exception):
    """Shared state that would not be one source of truth (names the setting to change)."""


def shared_url(env: Mapping[str, str] | None = None) -> str | None:
    """The shared database's URL, or None for the embedded SQLite default."""
    url = (os.environ if env is None else env).get(DATABASE_URL_ENV) or None
    if url is not None and not url.startswith(POSTGRES_PREFIXES):
        # One SQLite file for every store would lose the subject keys' secure delete.
        raise ValueError(
            f"{DATABASE_URL_ENV}={redacted(url)}: expected postgresql://user@host:port/db; for SQLite"
            " leave it unset (each store is a file in the state directory)"
        )
    return url


def store_url(state: Path, store: Store, env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    if store is Store.LEDGER and env.get(LEDGER_URL_ENV):
        return env[LEDGER_URL_ENV]
    return shared_url(env) or SQLITE_PREFIX + str(Path(state) / SQLITE_FILES[store])


def open_store(state: Path, store: Store, env: Mapping[str, str] | None = None) -> SqliteDatabase | PostgresDatabase:
    # Erasing a subject is deleting its key's row: the SQLite file must not keep the bytes.
    return open_database(store_url(state, store, env), secure_delete=store is Store.SUBJECT_KEYS)


def redacted_store_url(state: Path, store: Store, env: Mapping[str, str] | None = None) -> str:
    return redacted(store_url(state, store, env))


def ledger_url(state: Path, explicit: str | None = None) -> str:
    """`explicit`, else `$SWITCHYARD_LEDGER_URL`, else the shared URL, else `ledger.db` here."""
    return explicit or store_url(state, Store.LEDGER)


def filesystem_type(path: Path, mountinfo: Path = Path("/proc/self/mountinfo")) -> str | None:
    """The type of the filesystem `path` is on (the longest mount point above it), or None
    where the mount table cannot be read (not Linux)."""
    try:
        lines = mountinfo.read_text().splitlines()
    except OSError:
        return None
    target = str(Path(path).resolve())
    best, kind = "", None
    for line in lines:
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or not tail:
            continue
        mount = fields[4].replace("\\040", " ")
        inside = target == mount or target.startswith(mount.rstrip("/") + "/")
        if inside and len(mount) >= len(best):
            best, kind = mount, tail[0]
    return kind


def is_network_filesystem(kind: str | None) -> bool:
    return kind is not None and (kind in NETWORK_FILESYSTEMS or kind.startswith("fuse."))


def check_layout(state: Path, hosts: int, env: Mapping[str, str] | None = None) -> None:
    """Refuse SQLite state that cannot be the cluster's one source of truth.

    `hosts`: how many distinct hosts the cluster's nodes are on (several Ray nodes on one
    machine share its filesystem, so they count once)."""
    if shared_url(env) is not None:
        return
    where = Path(state)
    kind = filesystem_type(where)
    if is_network_filesystem(kind):
        raise UnsafeLayout(
            f"the state directory {where} is on a network filesystem ({kind}), and SQLite's locking is"
            f" unreliable there: set {DATABASE_URL_ENV}=postgresql://... (docs/deploy.md, multi-node),"
            " or put the state directory on a local disk"
        )
    if hosts > 1:
        raise UnsafeLayout(
            f"the cluster's nodes are on {hosts} hosts, and SQLite state in {where} is local to one of them:"
            f" gateway replicas elsewhere would open their own keys, audit and idempotency files."
            f" Set {DATABASE_URL_ENV}=postgresql://... (docs/deploy.md, multi-node)"
        )


def host_identity() -> str:
    """This machine, as two processes on it agree (hostname and boot id)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def state_identity(state: Path, env: Mapping[str, str] | None = None) -> str:
    """What two processes compare to know they share one source of truth: the shared URL's
    host and database, or, for SQLite, this host and the state directory's real path."""
    url = shared_url(env)
    if url is not None:
        return "shared:" + redacted(url)
    return f"sqlite:{host_identity()}:{Path(state).resolve()}"


def require_same_state(head: str, state: Path, env: Mapping[str, str] | None = None) -> None:
    """Refuse to run a gateway replica whose shared state is not the head's (`head` is the
    head's `state_identity`): its keys, audit and idempotent answers would be another copy."""
    mine = state_identity(state, env)
    if mine != head:
        raise UnsafeLayout(
            f"this node's shared state is {mine}, the head's is {head}: SQLite state is local to one host"
            f" and one state directory, so replicas elsewhere cannot share it. Set"
            f" {DATABASE_URL_ENV}=postgresql://... on every node (docs/deploy.md, multi-node)"
        )
