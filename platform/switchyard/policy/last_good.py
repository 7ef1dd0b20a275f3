"""The last policy set that loaded, kept in the state directory so a replica can start on it.

A replica that (re)starts while someone's edit left the policy files invalid must not fail
to start (Serve would restart it forever) nor start with no policy at all. The store writes
the exact bytes of every set that took effect to `<state>/policy_last_good/<fingerprint>/`
and points `CURRENT` at it; at start-up, if the live files do not load, that copy is loaded
through the same loader, and the replica reports itself degraded until the files are fixed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
from collections.abc import Mapping
from pathlib import Path

from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)

KEEP = 2  # the set in force and the one before it, in case a replica is still reading it


class LastGoodSet:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def save(self, policy_set: PolicySet) -> None:
        self.save_sources(policy_set.fingerprint, policy_set.sources)

    def save_sources(self, fingerprint: str, sources: Mapping[str, bytes]) -> Path:
        """Write a set's files under its fingerprint and make it CURRENT; returns its directory."""
        name = fingerprint[:24]
        final = self.directory / name
        if not final.is_dir() or not _holds(final, sources):
            tmp = self.directory / f".{name}.{os.getpid()}.tmp"
            shutil.rmtree(tmp, ignore_errors=True)
            for rel, data in sources.items():
                if Path(rel).is_absolute() or ".." in Path(rel).parts:
                    raise ValueError(f"policy file {rel!r} is not a path inside the policy directory")
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            # A copy under this name that is not these bytes was changed on disk (or saved from
            # bytes changed in transit): it is replaced, or the set could never be loaded here
            # again (it would load as another fingerprint every time).
            stale = self.directory / f".{name}.{os.getpid()}.stale"
            if final.is_dir():
                log.warning("the saved policy set %s in %s is not the bytes it was saved as; replacing it", name, final)
                with contextlib.suppress(OSError):  # another replica on this host moved it first
                    final.rename(stale)
            try:
                tmp.rename(final)
            except OSError:  # another replica on this host saved the same set first
                shutil.rmtree(tmp, ignore_errors=True)
            shutil.rmtree(stale, ignore_errors=True)
        pointer = self.directory / f".CURRENT.{os.getpid()}.tmp"
        pointer.write_text(name + "\n")
        pointer.replace(self.directory / "CURRENT")  # atomic: a reader sees the old name or the new
        self._prune(keep={name})
        return final

    def path(self) -> Path | None:
        """The directory of the last good set, or None if no set was ever saved here."""
        try:
            name = (self.directory / "CURRENT").read_text().strip()
        except FileNotFoundError:
            return None
        found = self.directory / name
        return found if name and found.is_dir() else None

    def _prune(self, keep: set[str]) -> None:
        saved = sorted(
            (p for p in self.directory.iterdir() if p.is_dir() and not p.name.startswith(".")),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for old in saved[KEEP:]:
            if old.name not in keep:
                shutil.rmtree(old, ignore_errors=True)

    @classmethod
    def in_state_dir(cls, state: Path) -> LastGoodSet:
        directory = state / "policy_last_good"
        directory.mkdir(parents=True, exist_ok=True)
        return cls(directory)


def _holds(directory: Path, sources: Mapping[str, bytes]) -> bool:
    """Whether `directory` holds exactly `sources`: those files, those bytes, nothing else."""
    try:
        present = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file()}
        return present == set(sources) and all((directory / rel).read_bytes() == data for rel, data in sources.items())
    except OSError:
        return False
