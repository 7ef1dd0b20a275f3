"""Prepare batches on a background thread, ahead of the training loop.

One producer thread reads the source iterator into a bounded queue (depth 2 by default), so
slicing the corpus, stacking rows and (on a GPU) pinning the host copies overlap with the
step instead of preceding it; the order is the source's. A failure in the producer is raised
in the consumer as the original exception, at the point in the stream where it happened.
`close()` stops and joins the thread, also while it is blocked on a full queue.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Generic, TypeVar

T = TypeVar("T")
_POLL_S = 0.1
"""How often a producer blocked on a full queue looks for `close()`."""


class _End:
    """The source is exhausted."""


class _Failed:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class BackgroundBatches(Iterator[T], Generic[T]):
    """Iterate `source` through a queue filled by one background thread."""

    def __init__(self, source: Iterator[T], depth: int = 2, prepare: Callable[[T], T] | None = None) -> None:
        """`prepare` runs on the producer thread for each item (e.g. pinning its tensors)."""
        if depth < 1:
            raise ValueError(f"queue depth must be >= 1, got {depth}")
        self._source = source
        self._prepare = prepare
        self._queue: queue.Queue[T | _End | _Failed] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._done = False
        self._thread = threading.Thread(target=self._produce, name="batch-producer", daemon=True)
        self._thread.start()

    def _put(self, item: T | _End | _Failed) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=_POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def _produce(self) -> None:
        try:
            for item in self._source:
                if not self._put(item if self._prepare is None else self._prepare(item)):
                    return
            self._put(_End())
        except BaseException as exc:  # noqa: BLE001  (handed to the consumer, which raises it)
            self._put(_Failed(exc))

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        item = self._queue.get()
        if isinstance(item, _End):
            self._done = True
            raise StopIteration
        if isinstance(item, _Failed):
            self._done = True
            raise item.error
        return item

    def close(self) -> None:
        """Stop the producer and wait for it (at most one item it is preparing)."""
        self._stop.set()
        self._done = True
        self._thread.join()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def __enter__(self) -> BackgroundBatches[T]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()
