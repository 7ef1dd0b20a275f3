"""Policy sets published by the head, and the replica's side: serve the published set, never local files.

On a cluster, each node's checkout of the policy repository is its own: a change merged and
pulled on the head would never reach the other nodes. So the head alone reads policy files.
Its `PolicyStore` validates every change as `policy check` does (an invalid change is
journaled and refused; the last valid set stays in force) and publishes the accepted set: the
exact bytes of every file and their fingerprint. Each replica fetches the published set, writes
it to its own state directory (eval records are files the gateway reads from the set's
directory), loads it with its own loader, and serves it only if that reproduces the published
fingerprint. Each fetch also reports the fingerprint the replica serves, so the head can show
every replica's.

A replica that cannot get a set at start does not start (Serve retries it; it never takes
traffic on a set nobody published). One that loses the head later keeps serving the set it
has (it was published, so it was valid) and shows itself degraded until the head answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.policy.errors import PolicyError, PolicyViolation
from switchyard.policy.last_good import LastGoodSet
from switchyard.policy.loader import load_policy_set
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PublishedSet:
    """What the head publishes: the accepted set's files, byte for byte, and its fingerprint."""

    fingerprint: str
    sources: Mapping[str, bytes]
    git_commit: str | None = None
    published_at: float = 0.0


@dataclass(frozen=True)
class ReplicaReport:
    """What a replica tells the head each time it asks for the set."""

    replica: str
    node: str
    fingerprint: str | None  # the set it serves (None: none yet)
    state: str  # "ok" or "degraded"
    error: str | None = None


class PolicyUnavailable(Exception):
    """No published policy set could be fetched or loaded (names why)."""


Fetch = Callable[[str | None, ReplicaReport], PublishedSet | None]
"""Ask the head for its set: None when the replica already serves `known` (the fingerprint).
Raises `PolicyUnavailable` when the head cannot be asked."""


def published(policy_set: PolicySet, git_commit: str | None = None) -> PublishedSet:
    return PublishedSet(policy_set.fingerprint, dict(policy_set.sources), git_commit, time.time())


class PublishedPolicyStore:
    """A replica's policy set in force: the head's published one (the `PolicyStore` interface
    the gateway reads: `current`, `degraded`, `refresh()`, `status()`)."""

    def __init__(self, fetch: Fetch, copies: LastGoodSet, replica: str, node: str) -> None:
        self._fetch = fetch
        self._copies = copies
        self.replica = replica
        self.node = node
        self.last_error: str | None = None
        self.rejected = 0  # published sets this replica could not load
        self.current: PolicySet = self._start()

    @property
    def degraded(self) -> bool:
        return self.last_error is not None

    def _report(self, fingerprint: str | None) -> ReplicaReport:
        state = "degraded" if self.degraded else "ok"
        return ReplicaReport(self.replica, self.node, fingerprint, state, self.last_error)

    def _start(self) -> PolicySet:
        offer = self._fetch(None, self._report(None))  # PolicyUnavailable: the replica does not start
        if offer is None:
            raise PolicyUnavailable("the head has no policy set to publish (its policy files never loaded)")
        try:
            return self._adopt(offer)
        except PolicyError as exc:
            message = f"the published policy set {offer.fingerprint[:12]} does not load here:\n{exc}"
            raise PolicyUnavailable(message) from exc

    def _adopt(self, offer: PublishedSet) -> PolicySet:
        directory = self._copies.save_sources(offer.fingerprint, offer.sources)
        loaded = load_policy_set(directory)
        if loaded.fingerprint != offer.fingerprint:
            # Another loader (an older or newer build than the head's) read other files or
            # other bytes: serving it would not be the set the head validated.
            message = f"loads as {loaded.fingerprint[:12]}, not the published {offer.fingerprint[:12]}"
            raise PolicyError([PolicyViolation(str(directory), "", message)])
        log.info("serving published policy set %s (git %s)", offer.fingerprint[:12], offer.git_commit)
        return loaded

    def refresh(self) -> bool:
        """Ask the head; adopt a new set if it has one. True when a new set took effect. Never
        raises: a failure keeps the set in force and marks the replica degraded."""
        try:
            offer = self._fetch(self.current.fingerprint, self._report(self.current.fingerprint))
        except PolicyUnavailable as exc:  # keep serving what was published
            self.last_error = str(exc)
            log.warning("%s; serving %s", self.last_error, self.current.fingerprint[:12])
            return False
        if offer is None:
            self.last_error = None
            return False
        try:
            self.current = self._adopt(offer)
        except (PolicyError, OSError) as exc:
            self.rejected += 1
            self.last_error = f"the published set {offer.fingerprint[:12]} does not load here: {exc}"
            log.error("%s; serving %s", self.last_error, self.current.fingerprint[:12])
            return False
        self.last_error = None
        return True

    def status(self) -> dict[str, Any]:
        return {
            "source": "published",
            "state": "degraded" if self.degraded else "ok",
            "fingerprint": self.current.fingerprint,
            "teams": sorted(self.current.teams),
            "last_error": self.last_error,
            "rejected_changes": self.rejected,
        }


@dataclass
class ReplicaBoard:
    """The head's view of who serves which set: the latest report of every replica, timed on
    the head's monotonic clock when it arrived. (Reports carried the replica's own wall-clock
    time: a replica whose clock ran 5 minutes behind the head's was forgotten as soon as it
    reported, and one ahead stayed "ok" for minutes after it went silent: stop 48.)"""

    stale_after_s: float = 30.0
    reports: dict[str, tuple[ReplicaReport, float]] = field(default_factory=dict)  # replica -> report, when

    def record(self, report: ReplicaReport, now: float | None = None) -> None:
        self.reports[report.replica] = (report, time.monotonic() if now is None else now)

    def rows(self, now: float | None = None) -> list[dict[str, Any]]:
        now = time.monotonic() if now is None else now
        # A replica that stopped asking is gone (or cut off): listed as such, then forgotten.
        for gone in [r for r, (_, at) in self.reports.items() if now - at > 10 * self.stale_after_s]:
            del self.reports[gone]
        return [
            {
                "replica": rep.replica,
                "node": rep.node,
                "fingerprint": rep.fingerprint,
                "state": rep.state if now - at <= self.stale_after_s else "silent",
                "error": rep.error,
                "seen_s_ago": round(now - at, 1),
            }
            for rep, at in sorted(self.reports.values(), key=lambda r: r[0].replica)
        ]


def save_dir_for(state_dir: Path) -> LastGoodSet:
    """Where a replica keeps the published sets it received (per host, like the last good set)."""
    directory = state_dir / "policy_published"
    directory.mkdir(parents=True, exist_ok=True)
    return LastGoodSet(directory)
