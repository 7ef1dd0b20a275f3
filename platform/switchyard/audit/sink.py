"""`AuditSink` for the gateway: build the record per data policy, then store or spool it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from switchyard.audit.builder import PendingEntry, RecordBuilder
from switchyard.audit.data_policy import DataPolicySource
from switchyard.audit.group_commit import GroupCommitter
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.spool import AuditSpool, DrainReport, recover_orphans
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.db.engine import database_errors, redacted
from switchyard.gateway.seams import AuditUnavailable, Exchange
from switchyard.policy.models import BodyStorage, RiskTier

log = logging.getLogger(__name__)

# Below this many characters of bodies, a record that needs no redaction builds in ~0.1 ms
# (JSON, AES-GCM, one local key read): less than the hop to a worker thread costs.
INLINE_BUILD_CHARS = 16_384


class StoreAuditSink:
    """Implements `switchyard.gateway.seams.AuditSink`.

    High-risk flows are always written durably, whatever the caller asks: the durability rule
    belongs to the data, not to the call site.
    """

    def __init__(self, builder: RecordBuilder, store: AuditStore, spool: AuditSpool | None) -> None:
        self.builder = builder
        self.store = store
        self.spool = spool
        self._commits = GroupCommitter(store)  # durable appends of concurrent requests share a commit
        self._starting = asyncio.Lock()
        # The store or keyring cannot answer (locked, full, unreachable): `AuditUnavailable`.
        self._unavailable = database_errors()
        self._not_taken: tuple[type[Exception], ...] = (*self._unavailable, TimeoutError)  # or not in time
        self._unbuildable: tuple[type[Exception], ...] = (*self._unavailable, OSError)

    async def _started_spool(self) -> AuditSpool:
        """The spool, started on first use: a sink may be built where no event loop runs yet
        (a Serve replica's constructor)."""
        assert self.spool is not None
        if not self.spool.started:
            async with self._starting:
                if not self.spool.started:
                    await self.spool.start()
        return self.spool

    def _short_build(self, exchange: Exchange) -> bool:
        """Whether building the record is short enough for the event loop: nothing to redact,
        small bodies, and a keyring on this machine (a database server's round trip is not)."""
        cls = self.builder.data_class(exchange.ctx.flow.data_class)
        if BodyStorage.REDACTED in (cls.store_input, cls.store_output) or self.builder.keyring.db.dialect != "sqlite":
            return False
        budget = INLINE_BUILD_CHARS - len(exchange.output_text or "") - len(str(exchange.output_tool_calls))
        for message in exchange.input_messages:
            budget -= _chars(message)
            if budget < 0:
                return False
        return True

    async def _build(self, exchange: Exchange) -> PendingEntry:
        try:
            if self._short_build(exchange):
                return self.builder.build(exchange)
            # Redaction and large bodies are CPU work (~ms): off the event loop.
            return await asyncio.to_thread(self.builder.build, exchange)
        except self._unbuildable as exc:
            log.error("the audit record of request %s cannot be built: %s", exchange.ctx.request_id, exc)
            raise AuditUnavailable(f"the subject keyring is unavailable ({type(exc).__name__})") from exc

    async def open_stream(self, stand_in: Exchange, durable: bool) -> None:
        if self.spool is None:
            return  # no spool, no stand-ins: a replica's death can lose its open streams' records
        pending = await self._build(stand_in)
        high = durable or stand_in.ctx.flow.risk_tier is RiskTier.HIGH
        await (await self._started_spool()).open_stream(pending, durable=high)

    async def record(
        self, exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        durable = durable or exchange.ctx.flow.risk_tier is RiskTier.HIGH
        pending = await self._build(exchange)
        if durable or self.spool is None:
            await self._commit(pending, within_s, withholds)
        else:
            await (await self._started_spool()).put(pending)
        if self.spool is not None:
            self.spool.close_stream(exchange.ctx.request_id)  # stored or spooled: it supersedes a stand-in

    async def _commit(self, pending: PendingEntry, within_s: float | None, withholds: bool) -> None:
        try:
            await self._commits.append(pending, within_s)
        except self._not_taken as exc:
            log.error(
                "audit store %s did not take the record of request %s: %s",
                redacted(self.store.db.url),
                pending.record.request_id,
                exc,
            )
            if self.spool is not None:
                # Not durable in the store: kept for the store's return, as the caller answers
                # (the request may have been billed). An answer that waited on this record is
                # withheld, so its record says what the caller got instead.
                kept = pending.withheld() if withholds else pending
                await (await self._started_spool()).put(kept)
            raise AuditUnavailable(f"the audit store is unavailable ({type(exc).__name__})") from exc

    async def recover(self) -> DrainReport:
        """Drain what dead writers on this host left in the spool directory: call before taking
        traffic, after the budget gate's recovery (a dead replica's stand-ins state the charges
        its journal sends to the ledger)."""
        if self.spool is None or not self.spool.directory.is_dir():
            return DrainReport(0, 0, 0, 0)
        return await asyncio.to_thread(recover_orphans, self.spool.directory, self.store, self.spool.ledger)

    async def close(self) -> None:
        """Drain the spool into the store and release it (a gateway replica's shutdown)."""
        await self._commits.close()
        if self.spool is not None and self.spool.started:
            await self.spool.stop()
        self.store.close()


def _chars(message: dict[str, Any]) -> int:
    """About how many characters a message holds: its text, image URLs and tool-call arguments."""
    content = message.get("content")
    if isinstance(content, list):
        parts = [p for p in content if isinstance(p, dict)]
        n = sum(len(str(p.get("text") or p.get("image_url") or "")) for p in parts)
    else:
        n = len(content) if isinstance(content, str) else 0
    return n + sum(len(str(call)) for call in message.get("tool_calls") or ())


async def open_sink(
    state: Path,
    policies: DataPolicySource,
    scrubber: TextScrubber | None = None,
    spooled: bool = True,
    drain_interval_s: float = 0.2,
    on_backlog: Callable[[int], None] | None = None,
) -> StoreAuditSink:
    """The standard wiring under a state directory: its audit store and keyring (SQLite files
    `<state>/audit/{audit.db,keys.db}`, or the shared database) and `<state>/audit/spool/`.

    Starting the spool drains what dead writers left behind first.
    """
    store = AuditStore.in_state_dir(state)
    keyring = SubjectKeyring.in_state_dir(state)
    builder = RecordBuilder(policies, scrubber or TextScrubber(), keyring)
    spool = None
    if spooled:
        spool = AuditSpool(state / "audit" / "spool", store, drain_interval_s=drain_interval_s, on_backlog=on_backlog)
        await spool.start()
    return StoreAuditSink(builder, store, spool)
