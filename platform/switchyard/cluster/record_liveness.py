"""Whether a platform record (`up.json`) still describes a running platform, asked before a
command attaches to its cluster.

A record outlives its platform when the machine restarts or the supervisor is killed, and Ray's
driver then retries a cluster that is gone for minutes, printing warnings, before it gives up:
`switchyard status` after a reboot hung instead of saying the platform is down, and `up` told
the operator to look at that hanging `status`.
"""

from __future__ import annotations

import socket
from pathlib import Path

from switchyard.cluster.record import PlatformRecord
from switchyard.cluster.supervisor import look_up

GCS_ANSWER_TIMEOUT_S = 5.0  # a live GCS accepts a connection at once; this only bounds a dead route


def supervisor_gone(state: Path, record: PlatformRecord) -> str | None:
    """Why a local platform's record names no running supervisor of `state`; None when it
    does, or when the platform is attached (it has no supervisor of its own)."""
    if not record.owns_cluster:
        return None
    pid = record.supervisor_pid
    assert pid is not None, "a platform that owns its cluster records its supervisor"
    supervisor = look_up(pid)
    if supervisor.serves(state):
        return None
    if (other := supervisor.serves_another(state)) is not None:
        return f"the record is a copy: PID {pid} supervises another platform (state dir {other})"
    return (
        f"its supervisor (PID {pid}) is no longer running: the machine restarted, or it was stopped "
        "without `switchyard down`"
    )


def cluster_silent(record: PlatformRecord, timeout_s: float = GCS_ANSWER_TIMEOUT_S) -> str | None:
    """Why the record's Ray cluster cannot be reached (its GCS accepts no connection); None
    when it answers."""
    silent = address_silent(record.ray_address, timeout_s)
    return None if silent is None else f"its {silent}"


def address_silent(address: str, timeout_s: float = GCS_ANSWER_TIMEOUT_S) -> str | None:
    """Why no Ray cluster answers at `address` (a GCS's host:port); None when one does (or
    when `address` is "auto": Ray looks for the cluster on this machine itself)."""
    if address == "auto":
        return None
    target = address.split("://", 1)[1] if "://" in address else address  # ray://host:port too
    host, _, port = target.rpartition(":")
    if not host or not port.isdigit():
        return f"Ray address {address!r} is not host:port (the head's GCS, e.g. 127.0.0.1:6379)"
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"Ray cluster at {address} does not answer ({exc.strerror or type(exc).__name__})"


def not_running(state: Path, record: PlatformRecord) -> str | None:
    """Why the platform recorded in `state` is not running; None when it may be (its supervisor
    is alive and its cluster answers)."""
    return supervisor_gone(state, record) or cluster_silent(record)


def stale_record_message(state: Path, why: str) -> str:
    return (
        f"no platform is running for state dir {state}, though it has a record of one: {why}. "
        f"`switchyard down --state-dir {state}` clears the record; `switchyard up` starts a platform"
    )
