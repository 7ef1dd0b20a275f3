"""A fake OpenAI-wire upstream on 127.0.0.1 whose every attempt follows a script, and which
keeps the provider's side of the books: what it billed, for which request, at which model.

A request is found by the marker in its last message (`[m:<id>]`); its attempts, across
models, take the script's actions in order (then `ok`). Actions: `ok`, `invalid` (an answer
that is not JSON), `nousage` (an answer without usage), `malformed` (a 200 whose body does
not parse), `500`, `429`, `timeout` (answers after the gateway gave up), `cut` (a stream that
stops half-way), `late-done` (a stream that sends its answer and usage, then its `[DONE]` after
the gateway gave up; an answer like `ok` when not streamed). Billed: every 200 the provider
sent (`ok`, `invalid`, `nousage`, `malformed`, `cut`, `late-done`), with its usage when it
reported one, read or not; not billed: errors and timeouts.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from gw_server import request_body

from switchyard.gateway.seams import Usage

MARKER = re.compile(r"\[m:(\d+)\]")
ANSWER = '{"answer": "ok"}'


@dataclass(frozen=True)
class Billed:
    provider: str  # "azure-openai" when called under /azure/, else "openai"
    model_version: str
    usage: Usage | None  # None: billed, usage not reported (or not readable)
    true_usage: Usage  # what the provider billed, reported or not
    messages: tuple[tuple[str, str], ...]  # what the gateway sent, to bound an unreported bill
    max_tokens: int


@dataclass
class ScriptedUpstream:
    timeout_sleep_s: float = 0.5
    scripts: dict[int, list[str]] = field(default_factory=dict)
    bills: defaultdict[int, list[Billed]] = field(default_factory=lambda: defaultdict(list))
    attempts: defaultdict[int, int] = field(default_factory=lambda: defaultdict(int))

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        assert scope["type"] == "http"
        body = await request_body(receive)
        try:
            params = json.loads(body)
        except ValueError:  # the gateway gave up while sending (its client left): nothing billed
            await _respond(send, 400, b'{"error": {"type": "invalid_request_error"}}')
            return
        found = MARKER.search(str(params["messages"][-1].get("content", "")))
        if found is None:
            found = MARKER.search(json.dumps(params["messages"]))
        marker = int(found[1]) if found else -1
        n = self.attempts[marker]
        self.attempts[marker] += 1
        script = self.scripts.get(marker, [])
        action = script[n] if n < len(script) else "ok"
        usage = Usage(7 + len(json.dumps(params["messages"])) // 40, 5)
        billed = Billed(
            "azure-openai" if scope["path"].startswith("/azure/") else "openai",
            params["model"],
            usage,
            usage,
            tuple((m["role"], str(m.get("content", ""))) for m in params["messages"]),
            int(params.get("max_tokens") or params.get("max_completion_tokens") or 0),
        )
        if params.get("stream"):
            await self._stream(action, marker, billed, send)
        else:
            await self._complete(action, marker, billed, send)

    def _bill(self, marker: int, billed: Billed, reported: bool) -> None:
        unreported = Billed(
            billed.provider, billed.model_version, None, billed.true_usage, billed.messages, billed.max_tokens
        )
        self.bills[marker].append(billed if reported else unreported)

    async def _complete(self, action: str, marker: int, billed: Billed, send: Any) -> None:
        if action in ("500", "429"):
            await _respond(send, int(action), b'{"error": {"type": "server_error", "message": "scripted"}}')
            return
        if action == "timeout":
            await asyncio.sleep(self.timeout_sleep_s)  # the gateway has given up: not billed
            await _respond(send, 504, b'{"error": {"type": "timeout", "message": "late"}}')
            return
        if action == "malformed":
            self._bill(marker, billed, reported=False)
            await _respond(send, 200, b'{"choices": [')
            return
        text = "not json at all" if action == "invalid" else ANSWER
        data: dict[str, Any] = {
            "id": f"cmpl-{marker}",
            "object": "chat.completion",
            "model": billed.model_version,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        }
        assert billed.usage is not None
        if action != "nousage":
            data["usage"] = {
                "prompt_tokens": billed.usage.prompt_tokens,
                "completion_tokens": billed.usage.completion_tokens,
            }
        self._bill(marker, billed, reported=action != "nousage")
        await _respond(send, 200, json.dumps(data).encode())

    async def _stream(self, action: str, marker: int, billed: Billed, send: Any) -> None:
        if action in ("500", "429", "malformed"):  # a stream that never started: an error
            await _respond(send, 500 if action != "429" else 429, b'{"error": {"type": "server_error"}}')
            return
        if action == "timeout":
            await asyncio.sleep(self.timeout_sleep_s)
            await _respond(send, 504, b'{"error": {"type": "timeout"}}')
            return
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]})
        words = ["Hello", " there", " from", " the", " script."]
        assert billed.usage is not None
        for i, word in enumerate(words):
            chunk = {
                "id": "c",
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": {"content": word}}],
            }
            await send(
                {"type": "http.response.body", "body": f"data: {json.dumps(chunk)}\n\n".encode(), "more_body": True}
            )
            await asyncio.sleep(0.002)
            if action == "cut" and i == 1:
                self._bill(marker, billed, reported=False)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return
        final = {
            "id": "c",
            "object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
        }
        await send({"type": "http.response.body", "body": f"data: {json.dumps(final)}\n\n".encode(), "more_body": True})
        if action != "nousage":
            u = {"prompt_tokens": billed.usage.prompt_tokens, "completion_tokens": billed.usage.completion_tokens}
            tail = {"id": "c", "object": "chat.completion.chunk", "choices": [], "usage": u}
            await send(
                {"type": "http.response.body", "body": f"data: {json.dumps(tail)}\n\n".encode(), "more_body": True}
            )
        self._bill(marker, billed, reported=action != "nousage")
        if action == "late-done":
            await asyncio.sleep(self.timeout_sleep_s)  # the gateway has given up waiting for the end
        await send({"type": "http.response.body", "body": b"data: [DONE]\n\n", "more_body": False})


async def _respond(send: Any, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": body, "more_body": False})
