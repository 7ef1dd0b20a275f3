"""Retention on a schedule: expired bodies are removed per class; records stay in the chain."""

from __future__ import annotations

import asyncio
import logging

from switchyard.audit.store import AuditStore

log = logging.getLogger(__name__)


async def run_retention(store: AuditStore, every_s: float = 3600.0) -> None:
    """Purge expired bodies every `every_s` until cancelled (the gateway app starts one task;
    `switchyard audit purge` does one pass from cron)."""
    while True:
        try:
            removed = await asyncio.to_thread(store.purge_expired_bodies)
            if removed:
                log.info("audit retention removed %d expired bodies", removed)
        except Exception:
            # Retried next round; bodies kept a little longer than policy is logged, not hidden.
            log.exception("audit retention pass failed; retrying in %.0fs", every_s)
        await asyncio.sleep(every_s)
