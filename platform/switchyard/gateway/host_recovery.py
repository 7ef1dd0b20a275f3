"""What dead gateway replicas on this host left behind, sent on by the live ones.

A gateway replica killed on a host leaves its charge journal (charges the ledger may not have
yet) and its audit spool (records, and stand-ins for its open streams) in the host's state
directory. The next replica to start on the host recovers both before it takes traffic. That
alone left two gaps, both closed by every live replica also looking again every `every_s`:

- Serve may restart the dead replica on another host, so nobody starts here again: its
  charges stayed out of the ledger, and once its holds expired (`LeaseConfig.ttl_s`, 150 s)
  their money went to other requests, so a budget could be overspent by all it had in flight.
  Looked for every 30 s by its live neighbours, its charges reach the ledger inside the TTL.
- A recovery keeps what it cannot send (the ledger or the audit store down); it waited for
  the next replica start or an operator's `switchyard audit drain`. Now the next pass retries.

The charge journals go first, then the audit spool: a dead writer's stream stand-ins state
what the ledger charged them, so they wait until its journal is in the ledger (docs/budgets.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

log = logging.getLogger(__name__)

RECOVER_EVERY_S = 30.0
"""Well inside a dead replica's hold TTL (150 s), and a directory scan costs ~0.1 ms."""


class Recovers(Protocol):
    async def recover(self) -> object:
        """Send on what dead writers on this host left; keep what cannot be sent yet."""
        ...


class HostRecovery:
    def __init__(self, budget: Recovers, audit: Recovers, every_s: float = RECOVER_EVERY_S) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        self.budget = budget
        self.audit = audit
        self.every_s = every_s
        self._task: asyncio.Task[None] | None = None

    async def recover(self) -> None:
        """One pass, charges first. Errors propagate: a replica's startup pass fails loudly."""
        await self.budget.recover()
        await self.audit.recover()

    def start(self) -> None:
        """Look again every `every_s` on the running loop, until `stop`."""
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name="host-recovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            try:
                await self.recover()
            except Exception:
                # The ledger or the audit store may be down: what was not sent stays on disk for
                # the next pass; the replica goes on serving.
                log.exception(
                    "recovering dead replicas' charges and audit records failed; retrying in %.0fs", self.every_s
                )
