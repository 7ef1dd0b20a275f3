"""A provider that runs a Python callable in-process: the seam tests and benchmarks use to
drive the pipeline without sockets (like HTTPX's MockTransport)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

from switchyard.gateway.providers.base import Completion, Delta, ProviderCall

Responder = Callable[[ProviderCall], Awaitable[Completion]]


class InProcessProvider:
    def __init__(self, name: str, responder: Responder, *, stream_chunk_chars: int = 16) -> None:
        self.name = name
        self.responder = responder
        self.stream_chunk_chars = stream_chunk_chars
        self.calls: int = 0

    async def complete(self, call: ProviderCall) -> Completion:
        self.calls += 1
        return await self.responder(call)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        done = await self.complete(call)
        step = self.stream_chunk_chars
        for i in range(0, len(done.text), step):
            yield Delta(text=done.text[i : i + step])
        yield Delta(finish_reason=done.finish_reason, usage=done.usage)

    async def aclose(self) -> None:
        return None
