"""Where runtime state lives: key hashes, policy overlays, ledger, audit and scheduler databases.

Never in git. `SWITCHYARD_STATE_DIR` wins; otherwise `.switchyard/` in the current directory
when that is a switchyard checkout (so a repo's demo stays in the repo), else
`~/.switchyard`.
"""

from __future__ import annotations

import os
from pathlib import Path

STATE_DIR_ENV = "SWITCHYARD_STATE_DIR"


def state_dir(explicit: str | os.PathLike[str] | None = None) -> Path:
    """Return the state directory, creating it (mode 0700: it holds key hashes)."""
    if explicit is not None:
        path = Path(explicit)
    elif os.environ.get(STATE_DIR_ENV):
        path = Path(os.environ[STATE_DIR_ENV])
    elif (Path.cwd() / "pyproject.toml").exists() and (Path.cwd() / "platform" / "switchyard").is_dir():
        path = Path.cwd() / ".switchyard"
    else:
        path = Path.home() / ".switchyard"
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path.resolve()
