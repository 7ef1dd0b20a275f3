"""Work that must outlive the request that started it.

A client that hangs up cancels its handler; the settle-and-audit work of its request must
still run to the end, or money and records would be lost, and so must the call of a request
with an Idempotency-Key, whose answer the client's retry replays. Such work runs in tasks the
pipeline owns, which shutdown awaits (`drain`) before the budget gate and audit sink close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")


class OwnedTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def run(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_log_failure)
        return task

    async def drain(self) -> None:
        """Wait for the work still running, including work that work started."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def __len__(self) -> int:
        return len(self._tasks)


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("work a request left running failed", exc_info=task.exception())
