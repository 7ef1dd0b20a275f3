"""Redaction off the event loop, so one team's large message cannot delay other teams.

Presidio analyses ~100 KB of text in about a second, all of it CPU. Run on the event loop
that would stall every request on the replica for that long. Texts up to `inline_chars`
(the common case: a few ms) are redacted inline, which saves the thread hop; larger ones
go to a small thread pool whose size bounds how much of the replica's CPU large messages
can take. Presidio's regex matching releases the GIL, and the loop gets it back at least
every switch interval (5 ms), so small requests keep their latency.

A request that waits for, or runs in, the pool past its deadline gets `DeadlineExceeded`;
its redaction finishes in the background (a thread cannot be interrupted) but still
holds its pool slot, which is what keeps the pool bounded.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from switchyard.gateway.errors import DeadlineExceeded
from switchyard.gateway.messages import text_chars
from switchyard.gateway.seams import Redacted, Redactor


class RedactionPool:
    def __init__(self, workers: int = 1, inline_chars: int = 4096) -> None:
        self.inline_chars = inline_chars
        self._workers = workers
        self._executor: ThreadPoolExecutor | None = None  # made on first use: most replicas never need it

    async def redact(
        self, redactor: Redactor, messages: list[dict[str, Any]], data_class: str, timeout_s: float
    ) -> Redacted:
        if text_chars(messages) <= self.inline_chars:
            return redactor.redact(messages, data_class)
        if self._executor is None:
            self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix="redaction")
        job = asyncio.get_running_loop().run_in_executor(self._executor, redactor.redact, messages, data_class)
        job.add_done_callback(_retrieve)  # a job outliving its request still has its error read
        try:
            async with asyncio.timeout(max(timeout_s, 0.0)):
                return await asyncio.shield(job)
        except TimeoutError:
            raise DeadlineExceeded(
                "deadline_exceeded", "the flow's deadline passed while its messages were being redacted"
            ) from None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)


def _retrieve(job: asyncio.Future[Redacted]) -> None:
    if not job.cancelled():
        job.exception()
