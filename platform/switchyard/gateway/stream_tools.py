"""Tool calls in a streamed answer: restored piece by piece, and assembled for the audit record.

A provider streams a call as its id and name, then fragments of its arguments (OpenAI's
chunk shape, which every adapter produces). Redaction placeholders may straddle fragments,
so each call's arguments get their own restorer, as the answer's text does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from switchyard.gateway.providers.base import ToolCall, ToolCallDelta
from switchyard.gateway.seams import StreamRestorer


@dataclass
class _Call:
    restorer: StreamRestorer
    id: str = ""
    name: str = ""
    raw: list[str] = field(default_factory=list)  # as the provider sent it (what it billed)
    sent: list[str] = field(default_factory=list)  # restored, as the client received it


class StreamedToolCalls:
    def __init__(self, restorer: Callable[[], StreamRestorer]) -> None:
        self._new_restorer = restorer
        self._calls: dict[int, _Call] = {}

    def feed(self, deltas: tuple[ToolCallDelta, ...]) -> tuple[ToolCallDelta, ...]:
        """The pieces to send for these provider pieces (arguments restored so far)."""
        out: list[ToolCallDelta] = []
        for d in deltas:
            call = self._calls.get(d.index)
            if call is None:
                call = self._calls[d.index] = _Call(self._new_restorer())
            call.id = d.id or call.id
            call.name = d.name or call.name
            call.raw.append(d.arguments)
            restored = call.restorer.feed(d.arguments)
            call.sent.append(restored)
            if restored or d.id is not None or d.name is not None:
                out.append(ToolCallDelta(d.index, d.id, d.name, restored))
        return tuple(out)

    def flush(self) -> tuple[ToolCallDelta, ...]:
        """What each call's restorer still holds, once the answer has finished."""
        out: list[ToolCallDelta] = []
        for index, call in sorted(self._calls.items()):
            tail = call.restorer.flush()
            if tail:
                call.sent.append(tail)
                out.append(ToolCallDelta(index, arguments=tail))
        return tuple(out)

    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(ToolCall(c.id, c.name, "".join(c.sent)) for _, c in sorted(self._calls.items()))

    def raw_text(self) -> str:
        """The provider's own bytes of every call (names and arguments), for the usage bound."""
        return "".join(c.name + "".join(c.raw) for c in self._calls.values())
