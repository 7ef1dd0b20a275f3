"""The head's policy publisher: one named, detached actor pinned to the head node.

It owns the only `PolicyStore` that reads policy files (the head's checkout), refreshes it at
most every `refresh_s` when asked, and answers each replica's poll with the accepted set when
the replica's differs (`switchyard.policy.published`). It also answers what the gateway
replicas compare at start to know they share the head's state (`state_identity`), and, for
`switchyard status`, which set every replica serves.
"""

from __future__ import annotations

import hashlib
import logging
import time
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import RayError

from switchyard.cluster.placement import on_head
from switchyard.cluster.record import NAMESPACE
from switchyard.db.location import state_identity
from switchyard.policy.published import PolicyUnavailable, PublishedSet, ReplicaBoard, ReplicaReport, published
from switchyard.policy.store import PolicyStore, git_commit

log = logging.getLogger(__name__)

PUBLISHER_ACTOR = "switchyard-policy-publisher"
FETCH_TIMEOUT_S = 10.0


@ray.remote(num_cpus=0, max_restarts=-1)
class PolicyPublisher:
    def __init__(self, policies_dir: str, state_dir: str, refresh_s: float = 2.0) -> None:
        logging.basicConfig(level=logging.INFO)
        self.state_dir = Path(state_dir)
        self.store = PolicyStore(Path(policies_dir), self.state_dir)  # the head's files: validated here
        self.refresh_s = refresh_s
        self.board = ReplicaBoard()
        self._checked_at = time.monotonic()
        self._offer = published(self.store.current, git_commit(self.store.root))

    def _refresh(self) -> None:
        if time.monotonic() - self._checked_at < self.refresh_s:
            return
        self._checked_at = time.monotonic()
        if self.store.refresh():
            self._offer = published(self.store.current, git_commit(self.store.root))

    def fetch(self, known: str | None, report: ReplicaReport) -> PublishedSet | None:
        self._refresh()
        self.board.record(report)
        return None if known == self._offer.fingerprint else self._offer

    def publish_now(self) -> dict[str, Any]:
        """Re-read the files now (`switchyard policy publish`), not at the next poll."""
        self._checked_at = 0.0
        self._refresh()
        return self.status()

    def state_identity(self) -> str:
        return state_identity(self.state_dir)

    def status(self) -> dict[str, Any]:
        return {**self.store.status(), "published": self._offer.fingerprint, "replicas": self.board.rows()}


def publisher_name(policies_dir: Path | str, state_dir: Path | str) -> str:
    """One publisher per platform: two platforms on one cluster (tests do it) never share one."""
    digest = hashlib.sha256(f"{policies_dir}\0{state_dir}".encode()).hexdigest()[:10]
    return f"{PUBLISHER_ACTOR}-{digest}"


def policy_publisher(policies_dir: Path | str, state_dir: Path | str) -> Any:
    """The publisher, created on the head on first use and found by name afterwards."""
    return PolicyPublisher.options(  # type: ignore[attr-defined]
        name=publisher_name(policies_dir, state_dir),
        namespace=NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        **on_head(),
    ).remote(str(policies_dir), str(state_dir))


def find_publisher(policies_dir: Path | str, state_dir: Path | str) -> Any:
    """The running publisher of that platform (raises ValueError when there is none)."""
    return ray.get_actor(publisher_name(policies_dir, state_dir), namespace=NAMESPACE)


class PublisherClient:
    """The replica's `Fetch` over the actor: blocking, with a timeout (called off the event loop)."""

    def __init__(self, handle: Any, timeout_s: float = FETCH_TIMEOUT_S) -> None:
        self.handle = handle
        self.timeout_s = timeout_s

    def _ask(self, method: str, *args: Any) -> Any:
        try:
            return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout_s)
        except RayError as exc:  # dead, restarting, timed out, or its constructor failed
            raise PolicyUnavailable(
                f"cannot reach the policy publisher on the head: {type(exc).__name__}: {exc}"
            ) from exc

    def __call__(self, known: str | None, report: ReplicaReport) -> PublishedSet | None:
        return self._ask("fetch", known, report)  # type: ignore[no-any-return]

    def state_identity(self) -> str:
        return str(self._ask("state_identity"))
