"""The live policy set of a running component, reloaded when files change.

An invalid set never replaces a valid one: the error is kept (for `status`) and logged, and
the last valid set stays in force. Every change that takes effect, and every rejected one,
is appended to `<state>/policy_changes.jsonl` with the file hashes and the git commit.
"""

from __future__ import annotations

import json
import logging
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import hash_files, load_policy_set
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)


def git_commit(root: Path) -> str | None:
    """The commit the policy directory is at, with `+dirty` if it has local edits."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--", "."],
            capture_output=True,
            text=True,
            timeout=5,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        log.warning("cannot read the git commit of %s: %s", root, exc)
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


@dataclass(frozen=True)
class PolicyChange:
    at: float
    applied: bool
    fingerprint: str
    git_commit: str | None
    files: dict[str, str]
    error: str | None = None


class PolicyStore:
    def __init__(self, root: Path, state_dir: Path | None = None) -> None:
        self.root = Path(root).resolve()
        self._journal = state_dir / "policy_changes.jsonl" if state_dir is not None else None
        self.current: PolicySet = load_policy_set(self.root)  # the first load must succeed
        self.last_error: str | None = None
        self._seen = self.current.file_hashes
        self._record(PolicyChange(time.time(), True, self.current.fingerprint, git_commit(self.root), self._seen))

    def refresh(self) -> bool:
        """Reload if any file changed. Returns True when a new valid set took effect."""
        files = hash_files(self.root)
        if files == self._seen:
            return False
        self._seen = files
        commit = git_commit(self.root)
        try:
            candidate = load_policy_set(self.root)
        except PolicyError as exc:
            self.last_error = str(exc)
            log.error("policy change rejected; keeping the last valid set in force:\n%s", exc)
            self._record(PolicyChange(time.time(), False, "", commit, files, self.last_error))
            return False
        self.current = candidate
        self.last_error = None
        log.info("policy set %s took effect (git %s)", candidate.fingerprint[:12], commit)
        self._record(PolicyChange(time.time(), True, candidate.fingerprint, commit, files))
        return True

    def status(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "fingerprint": self.current.fingerprint,
            "teams": sorted(self.current.teams),
            "last_error": self.last_error,
        }

    def _record(self, change: PolicyChange) -> None:
        if self._journal is None:
            return
        with self._journal.open("a") as f:
            f.write(json.dumps(change.__dict__, sort_keys=True) + "\n")
