"""Work that must outlive the request that started it.

A client that hangs up cancels its handler; the settle-and-audit work of its request must
still run to the end, or money and records would be lost. Such work runs in tasks the
pipeline owns, which shutdown awaits (`drain`) before the budget gate and audit sink close.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)


class OwnedTasks:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()

    def run(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
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


def _log_failure(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("settling or auditing a request failed", exc_info=task.exception())
