"""Presidio analysis of large texts in a worker process.

Most of Presidio's time is `phonenumbers`' matcher, pure Python that holds the GIL. Run in a
thread of the gateway's process, a 100 KB message therefore still takes the GIL from the
event loop every few milliseconds for a second. In a worker process it takes none of it:
the calling thread waits on a pipe, and the loop runs the replica's other requests.

The worker is started on first use (`spawn`: forking a threaded process is unsafe) and
builds its own offline analyzer once; results come back as plain tuples.
"""

from __future__ import annotations

import functools
import logging
import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from presidio_analyzer import RecognizerResult

log = logging.getLogger(__name__)

Finding = tuple[str, int, int, float]  # entity type, start, end, score


def _exit_with_parent(parent: int) -> None:
    """A worker outlives a killed replica otherwise (SIGKILL runs no clean-up)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(0)

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


@functools.cache
def _worker_analyzer() -> Any:
    from switchyard.audit.presidio_engine import offline_analyzer

    return offline_analyzer()


def _analyze(text: str, entities: tuple[str, ...], score_threshold: float) -> list[Finding]:
    found = _worker_analyzer().analyze(
        text=text, language="en", entities=list(entities), score_threshold=score_threshold
    )
    return [(r.entity_type, r.start, r.end, r.score) for r in found]


class AnalysisProcessPool:
    def __init__(self, workers: int = 1) -> None:
        self._workers = workers
        self._executor: ProcessPoolExecutor | None = None
        self._lock = threading.Lock()

    def analyze(self, text: str, entities: tuple[str, ...], score_threshold: float) -> list[Any]:
        try:
            rows = self._pool().submit(_analyze, text, entities, score_threshold).result()
        except BrokenProcessPool:
            # The worker died (e.g. killed for memory): the next call starts a new one; this
            # request fails closed in the pipeline (nothing leaves unredacted).
            log.error("the redaction worker process died; starting a new one for the next request")
            with self._lock:
                self._executor = None
            raise
        return [RecognizerResult(entity, start, end, score) for entity, start, end, score in rows]

    def _pool(self) -> ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                self._executor = ProcessPoolExecutor(
                    self._workers,
                    mp_context=multiprocessing.get_context("spawn"),
                    initializer=_exit_with_parent,
                    initargs=(os.getpid(),),
                )
            return self._executor

    def close(self) -> None:
        with self._lock:
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
                self._executor = None
