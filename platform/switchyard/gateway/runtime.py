"""A running gateway: the pipeline plus the background refresh of policies and keys.

Policies are re-read every `refresh_s` (never per request; an invalid change is rejected by
`PolicyStore` and the last valid set stays). The key snapshot is replaced when the key
store's version (the head of its event chain) changes. A failure of either is logged, counted
and shown as degraded in the health detail; it never stops the loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from switchyard.db.engine import database_errors
from switchyard.gateway.auth import KeySnapshot
from switchyard.policy.keys import KeyStore
from switchyard.policy.store import PolicySource, PolicyStore

log = logging.getLogger(__name__)


@dataclass
class Sources:
    policies: PolicySource  # files (one host, tests) or the head's published set (a Serve replica)
    keys: KeyStore

    @classmethod
    def open(cls, policies_dir: str | Path, state_dir: str | Path) -> Sources:
        state = Path(state_dir)
        return cls(PolicyStore(Path(policies_dir), state), KeyStore.in_state_dir(state))

    def key_snapshot(self) -> KeySnapshot:
        # The version first: a change landing between the two reads is then seen as new by the
        # next refresh, never hidden under a version the snapshot does not reflect.
        version = self.keys.version()
        return KeySnapshot(self.keys.verifier(), version)


class Refresher:
    """Policies and keys refresh independently: a policy directory that cannot be read never
    holds back a key revocation, and a locked key database never holds back a policy change.
    Nothing that goes wrong ends the loop; each failure is logged and reported to `observe`."""

    def __init__(
        self,
        sources: Sources,
        snapshot: KeySnapshot,
        refresh_s: float = 2.0,
        observe: Callable[[str, bool], None] | None = None,
    ) -> None:
        self.sources = sources
        self.snapshot = snapshot
        self.refresh_s = refresh_s
        self.observe = observe or (lambda source, ok: None)
        self.keys_error: str | None = None

    def refresh_policies(self) -> None:
        self.sources.policies.refresh()  # never raises; keeps the last good set on failure
        self.observe("policies", not self.sources.policies.degraded)

    def refresh_keys(self) -> None:
        try:
            version = self.sources.keys.version()  # read before the keys: as in `key_snapshot`
            if version != self.snapshot.version:
                self.snapshot.replace(self.sources.keys.verifier(), version)
                log.info("key snapshot refreshed (%d keys)", len(self.snapshot.verifier.entries))
        except Exception as exc:
            # The snapshot in force stays; revocations wait for the next successful read.
            expected = isinstance(exc, database_errors(OSError))  # not a bug: no traceback
            log.error("key refresh failed, keeping the key snapshot in force: %s", exc, exc_info=not expected)
            self.keys_error = f"{type(exc).__name__}: {exc}"
            self.observe("keys", False)
            return
        self.keys_error = None
        self.observe("keys", True)

    def state(self) -> dict[str, Any]:
        """The policy store's status plus the key snapshot's, for the health detail."""
        return {
            **self.sources.policies.status(),
            "keys": {"state": "degraded" if self.keys_error else "ok", "last_error": self.keys_error},
        }

    def refresh_once(self) -> None:
        self.refresh_keys()
        self.refresh_policies()

    async def run(self) -> None:
        # One loop per source: a key read that hangs (Postgres behind a lock, or a dropped
        # connection) holds back key refreshes only. In one loop it held back policies too.
        async with asyncio.TaskGroup() as loops:
            loops.create_task(self._every(self.refresh_keys))
            loops.create_task(self._every(self.refresh_policies))

    async def _every(self, step: Callable[[], None]) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            started = time.monotonic()
            try:
                await asyncio.to_thread(step)  # file hashing and database reads block: off the loop
            except Exception:  # a bug in the step: logged, and the loop goes on
                log.exception("%s failed; the loop goes on with what is in force", step.__name__)
            log.debug("%s took %.1f ms", step.__name__, (time.monotonic() - started) * 1000)
