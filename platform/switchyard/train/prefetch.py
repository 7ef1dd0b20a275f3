"""Copy the next batch to the GPU while the current one computes.

The copy runs on a side stream from pinned memory with `non_blocking=True`; an event
recorded on the copy stream is waited on by the compute stream before the batch is used,
and every tensor gets `record_stream(compute)` so the caching allocator does not hand its
memory to another tensor while compute may still read it. Batches may be nested (dicts,
lists, tuples); every tensor inside is handled (Ray's own prefetcher skips `record_stream`
for dict batches). Without CUDA this is a plain iterator.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


def map_tensors(batch: T, fn: Callable[[Tensor], Tensor]) -> T:
    """Apply `fn` to every tensor in a nested dict / list / tuple, keeping the structure."""
    if isinstance(batch, Tensor):
        return fn(batch)  # type: ignore[return-value,no-any-return]
    if isinstance(batch, dict):
        return type(batch)((k, map_tensors(v, fn)) for k, v in batch.items())  # type: ignore[return-value]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(map_tensors(v, fn) for v in batch))  # type: ignore[return-value]
    if isinstance(batch, list | tuple):
        return type(batch)(map_tensors(v, fn) for v in batch)  # type: ignore[return-value]
    return batch


class DevicePrefetcher(Iterator[T]):
    """Iterate `source`, yielding each batch already on `device`, one batch ahead."""

    def __init__(self, source: Iterator[T], device: torch.device) -> None:
        self.source = source
        self.device = device
        self.on_cuda = device.type == "cuda" and torch.cuda.is_available()
        self.copy_stream = torch.cuda.Stream(device) if self.on_cuda else None
        self._next: T | None = None
        self._ready: torch.cuda.Event | None = None
        self._exhausted = False
        if self.on_cuda:
            self._preload()

    def _copy(self, t: Tensor) -> Tensor:
        if t.device.type == "cpu" and not t.is_pinned():
            # Only a pinned source makes the copy truly asynchronous to the host.
            t = t.pin_memory()
        return t.to(self.device, non_blocking=True)

    def _preload(self) -> None:
        try:
            batch = next(self.source)
        except StopIteration:
            self._exhausted = True
            return
        assert self.copy_stream is not None
        with torch.cuda.stream(self.copy_stream):
            self._next = map_tensors(batch, self._copy)
            self._ready = torch.cuda.Event()
            self._ready.record(self.copy_stream)

    def __next__(self) -> T:
        if not self.on_cuda:
            return map_tensors(next(self.source), lambda t: t.to(self.device))
        if self._exhausted:
            raise StopIteration
        compute = torch.cuda.current_stream(self.device)
        assert self._ready is not None
        compute.wait_event(self._ready)  # compute must not read before the copy lands
        batch = self._next

        def mark(t: Tensor) -> Tensor:
            # The tensor was allocated on the copy stream but is used on compute: tell the
            # allocator, or it may reuse the block once the copy stream moves on.
            t.record_stream(compute)
            return t

        map_tensors(batch, mark)
        self._preload()
        return batch  # type: ignore[return-value]
