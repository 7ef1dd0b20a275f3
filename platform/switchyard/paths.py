"""Where the platform finds its policy directory and the repository it was installed from."""

from __future__ import annotations

import os
from pathlib import Path

POLICIES_ENV = "SWITCHYARD_POLICIES"


def repo_root() -> Path:
    """The checkout this package lives in (platform/switchyard -> repo)."""
    return Path(__file__).resolve().parents[2]


def policies_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    if explicit is not None:
        return Path(explicit).resolve()
    if os.environ.get(POLICIES_ENV):
        return Path(os.environ[POLICIES_ENV]).resolve()
    return repo_root() / "policies"
