"""What `switchyard up` started, written to `<state>/up.json` so `down` stops exactly that."""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ValidationError

RECORD_FILE = "up.json"
NAMESPACE = "switchyard"  # the Ray namespace of the platform's named actors
SCHEDULER_ACTOR = "switchyard-scheduler"
GATEWAY_APP = "gateway"
CONSOLE_APP = "console"  # the web console, at /console on the same Serve HTTP port


class PlatformRecord(BaseModel):
    ray_address: str  # GCS address other drivers attach to
    dashboard_url: str | None
    gateway_url: str
    console_url: str | None = None  # None: a platform from before the console
    owns_cluster: bool  # True: `up` started the Ray head (its supervisor PID is below)
    supervisor_pid: int | None = None
    ray_temp_dir: str | None = None
    policies_dir: str
    state_dir: str
    gpus: int
    demo: bool = False
    started_at: float


def record_path(state: Path) -> Path:
    return state / RECORD_FILE


class RecordUnreadable(ValueError):
    """`up.json` is there but is not a platform record (damaged, or edited by hand): no command
    can tell what it started, so each refuses, naming the file, rather than guess."""


def read_record(state: Path) -> PlatformRecord | None:
    path = record_path(state)
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        return PlatformRecord.model_validate_json(text)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise RecordUnreadable(
            f"{path} is not a platform record ({where + ': ' if where else ''}{first['msg']}), so switchyard cannot "
            f"tell what `switchyard up` started from {state}. If no platform runs from there, delete the file; if one "
            f"does, stop its supervisor (`pgrep -af 'switchyard.cluster.head.*{state}'`) and then delete it"
        ) from None


def write_record(state: Path, record: PlatformRecord) -> None:
    tmp = record_path(state).with_suffix(".tmp")
    tmp.write_text(json.dumps(record.model_dump(), indent=2))
    os.replace(tmp, record_path(state))  # atomic: a reader never sees half a record


def clear_record(state: Path) -> None:
    record_path(state).unlink(missing_ok=True)
