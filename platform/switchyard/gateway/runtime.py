"""A running gateway: the pipeline plus the background refresh of policies and keys.

Policies are re-read every `refresh_s` (never per request; an invalid change is rejected by
`PolicyStore` and the last valid set stays). The key snapshot is replaced when the key
database's mtime changes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from pathlib import Path

from switchyard.gateway.auth import KeySnapshot
from switchyard.policy.keys import KeyStore
from switchyard.policy.store import PolicyStore

log = logging.getLogger(__name__)


@dataclass
class Sources:
    policies: PolicyStore
    keys: KeyStore

    @classmethod
    def open(cls, policies_dir: str | Path, state_dir: str | Path) -> Sources:
        state = Path(state_dir)
        return cls(PolicyStore(Path(policies_dir), state), KeyStore.in_state_dir(state))

    def key_snapshot(self) -> KeySnapshot:
        return KeySnapshot(self.keys.verifier(), self.keys.mtime())


class Refresher:
    def __init__(self, sources: Sources, snapshot: KeySnapshot, refresh_s: float = 2.0) -> None:
        self.sources = sources
        self.snapshot = snapshot
        self.refresh_s = refresh_s

    def refresh_once(self) -> None:
        self.sources.policies.refresh()
        mtime = self.sources.keys.mtime()
        if mtime != self.snapshot.version:
            self.snapshot.replace(self.sources.keys.verifier(), mtime)
            log.info("key snapshot refreshed (%d keys)", len(self.snapshot.verifier.entries))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            started = time.monotonic()
            try:
                # File hashing and SQLite reads block: keep them off the event loop.
                await asyncio.to_thread(self.refresh_once)
            except OSError as exc:
                log.error("policy/key refresh failed, keeping what is in force: %s", exc)
            log.debug("refresh took %.1f ms", (time.monotonic() - started) * 1000)
