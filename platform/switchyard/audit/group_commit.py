"""Group commit of durable audit appends: concurrent high-risk requests share one transaction.

Each caller's `append` returns only once a transaction holding its record has committed, so
a response still never leaves before its record is on stable storage; what changes is that
records arriving while one commit runs wait for it and then commit together (one `BEGIN` /
`fsync` / `COMMIT` for the batch). The first record after a quiet spell commits at once:
there is no timer, so no added delay at low load.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Protocol

from switchyard.audit.builder import PendingEntry

log = logging.getLogger(__name__)

MAX_BATCH = 256  # records per transaction: bounds one commit's time under a burst


class EntryStore(Protocol):
    def append(self, items: Sequence[PendingEntry]) -> int:
        """Appends `items` in one transaction (`AuditStore.append`)."""
        ...


class GroupCommitter:
    def __init__(self, store: EntryStore, max_batch: int = MAX_BATCH) -> None:
        self._store = store  # its `append` is looked up per commit, not bound once
        self._max_batch = max_batch
        self._waiting: list[tuple[PendingEntry, asyncio.Future[None]]] = []
        self._committer: asyncio.Task[None] | None = None

    async def append(self, pending: PendingEntry, within_s: float | None = None) -> None:
        """Returns once `pending` is committed; raises what its batch's commit raised.

        `within_s` bounds the wait for a record still queued behind a commit in flight (a store
        stuck behind another session's lock): past it the record is withdrawn, never to be
        committed by this committer, and `TimeoutError` raised. A record whose transaction is
        under way cannot be withdrawn, so its caller waits for that transaction, which the
        database's lock timeout bounds (`switchyard.db.engine`)."""
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        waiting = (pending, done)
        self._waiting.append(waiting)
        if self._committer is None or self._committer.done():
            self._committer = asyncio.create_task(self._commit_all(), name="audit-group-commit")
        await asyncio.wait({done}, timeout=within_s)
        if not done.done() and any(w is waiting for w in self._waiting):
            self._waiting = [w for w in self._waiting if w is not waiting]
            done.cancel()
            raise TimeoutError("the audit store did not take the record in time; it was withdrawn")
        await done

    async def _commit_all(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[: self._max_batch], self._waiting[self._max_batch :]
            try:
                await asyncio.to_thread(self._store.append, [pending for pending, _ in batch])
            except asyncio.CancelledError:
                # The loop is shutting down: no caller may take its record for committed.
                for _, done in batch + self._waiting:
                    done.cancel()
                self._waiting = []
                raise
            except Exception as exc:  # noqa: BLE001 - handed to every caller of the batch, which decides
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
                continue
            for _, done in batch:
                if not done.done():  # a caller that was cancelled meanwhile: its record is stored anyway
                    done.set_result(None)

    async def close(self) -> None:
        """Wait for the commits in flight (a replica's shutdown)."""
        if self._committer is not None and not self._committer.done():
            await self._committer
