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
from typing import Any, Protocol

from switchyard.policy.errors import PolicyError, PolicyViolation
from switchyard.policy.last_good import LastGoodSet
from switchyard.policy.loader import hash_files, load_policy_set, policy_files
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


def _stat_key(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


@dataclass(frozen=True)
class PolicyChange:
    at: float
    applied: bool
    fingerprint: str
    git_commit: str | None
    files: dict[str, str]
    error: str | None = None


class PolicySource(Protocol):
    """The policy set a component serves and how it stands: a `PolicyStore` over files (one
    host, the head), or a `PublishedPolicyStore` (a gateway replica on a cluster)."""

    @property
    def current(self) -> PolicySet: ...

    @property
    def degraded(self) -> bool: ...

    def refresh(self) -> bool: ...

    def status(self) -> dict[str, Any]: ...


class PolicyStore:
    """The policy set in force for one component, and why it may not be the files' current one.

    `degraded` is True while the set in force is not what the files say (they fail to load);
    the last good set stays in force, and the rejected change is journaled and logged."""

    def __init__(self, root: Path, state_dir: Path | None = None) -> None:
        self.root = Path(root).resolve()
        self._journal = state_dir / "policy_changes.jsonl" if state_dir is not None else None
        self._last_good = LastGoodSet.in_state_dir(state_dir) if state_dir is not None else None
        self.last_error: str | None = None
        self.rejected = 0  # changes rejected (or refreshes that failed) since start
        self._seen = self._signature() or {}
        try:
            self.current: PolicySet = load_policy_set(self.root)
        except PolicyError as exc:
            self.current = self._start_on_last_good(exc)
            self._reject(str(exc), git_commit(self.root))
            return
        self._took_effect(git_commit(self.root))

    @property
    def degraded(self) -> bool:
        return self.last_error is not None

    def refresh(self) -> bool:
        """Reload if any file changed. Returns True when a new valid set took effect. Never
        raises: whatever goes wrong, the set in force stays and the failure is journaled."""
        # Taken before the load: a file that changes while it is read shows up next tick.
        signature = self._signature()
        if signature is None or signature == self._seen:
            return False
        self._seen = signature
        commit = git_commit(self.root)
        try:
            candidate = load_policy_set(self.root)
        except PolicyError as exc:
            self._reject(str(exc), commit)
            return False
        except Exception as exc:  # a loader bug must not end policy (and so key) refreshes
            log.exception("loading the policy set failed unexpectedly")
            self._reject(f"the policy set could not be loaded ({type(exc).__name__}: {exc})", commit)
            return False
        self.current = candidate
        self.last_error = None
        self._took_effect(commit)
        return True

    def status(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "state": "degraded" if self.degraded else "ok",
            "fingerprint": self.current.fingerprint,
            "teams": sorted(self.current.teams),
            "last_error": self.last_error,
            "rejected_changes": self.rejected,
        }

    def _signature(self) -> dict[str, tuple[int, int]] | None:
        """Size and mtime of every policy file: a cheap change check (no file is read, so a
        50 MB file costs nothing until the loader refuses it)."""
        try:
            return {str(p.relative_to(self.root)): _stat_key(p) for p in policy_files(self.root)}
        except OSError as exc:  # e.g. a file removed between listing and stat: next tick
            log.warning("cannot list the policy directory %s this time: %s", self.root, exc)
            return None

    def _start_on_last_good(self, exc: PolicyError) -> PolicySet:
        saved = self._last_good.path() if self._last_good is not None else None
        if saved is None:
            raise exc  # nothing ever loaded here: there is no safe set to start on
        try:
            fallback = load_policy_set(saved)
        except PolicyError as copy_exc:
            raise PolicyError(
                [
                    *exc.violations,
                    PolicyViolation(str(saved), "", f"the last good copy does not load either: {copy_exc}"),
                ]
            ) from None
        if not fallback.fingerprint.startswith(saved.name):
            # Its bytes changed after it was saved (a disk, a hand): starting on it would serve a
            # set that never passed as the live files (a budget, a route), under no alarm.
            raise PolicyError(
                [
                    *exc.violations,
                    PolicyViolation(
                        str(saved),
                        "",
                        f"the last good copy loads as {fallback.fingerprint[:12]}, not the set {saved.name[:12]} "
                        "saved there: it was changed after it was saved, so nothing starts on it",
                    ),
                ]
            )
        log.error(
            "the policy files do not load; starting DEGRADED on the last good set %s:\n%s",
            fallback.fingerprint[:12],
            exc,
        )
        return fallback

    def _took_effect(self, commit: str | None) -> None:
        log.info("policy set %s took effect (git %s)", self.current.fingerprint[:12], commit)
        self._record(PolicyChange(time.time(), True, self.current.fingerprint, commit, self.current.file_hashes))
        if self._last_good is not None:
            try:
                self._last_good.save(self.current)
            except OSError as exc:  # the set is in force all the same; only a restart would miss it
                log.error("cannot save the last good policy set to %s: %s", self._last_good.directory, exc)

    def _reject(self, error: str, commit: str | None) -> None:
        log.error("policy change rejected; keeping the last valid set in force:\n%s", error)
        try:
            files = hash_files(self.root)  # what was rejected, for the journal (rare: may be slow)
        except OSError:
            files = {}
        self._record(PolicyChange(time.time(), False, "", commit, files, error))
        # Shown once journaled: whoever sees the status degraded finds the change in the journal.
        self.rejected += 1
        self.last_error = error

    def _record(self, change: PolicyChange) -> None:
        if self._journal is None:
            return
        try:
            with self._journal.open("a") as f:
                f.write(json.dumps(change.__dict__, sort_keys=True) + "\n")
        except OSError as exc:
            log.error("cannot append to the policy journal %s: %s", self._journal, exc)
