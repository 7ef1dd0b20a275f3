"""Messages as the gateway carries them: OpenAI's chat format, as plain dicts.

One shape from the client to every adapter, so each adapter translates from one format:
- `{"role": "system" | "user" | "assistant" | "tool", "content": ...}`;
- `content` is a string, a list of parts (`{"type": "text", "text": ...}`,
  `{"type": "image_url", "image_url": {"url": ..., "detail": ...}}`) or None (an assistant
  turn that only calls tools);
- an assistant message may carry `tool_calls`
  (`[{"id", "type": "function", "function": {"name", "arguments"}}]`, arguments a JSON text);
- a `tool` message answers one call: `tool_call_id` and `content`.

Text is everywhere a model reads or writes words: string content, text parts, tool-call
arguments and tool results. Redaction, size limits and token estimates walk it with
`map_text` / `texts`, so a tool's arguments are redacted as a prompt is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

Message = dict[str, Any]


def texts(message: Message) -> Iterator[str]:
    """Every text a model reads in `message` (content, text parts, tool-call arguments)."""
    content = message.get("content")
    if isinstance(content, str):
        yield content
    elif isinstance(content, list):
        for part in content:
            if part.get("type") == "text":
                yield part.get("text", "")
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {}
        yield fn.get("name", "")
        yield fn.get("arguments", "")


def map_text(message: Message, fn: Callable[[str], str]) -> Message:
    """`message` with `fn` applied to each of its texts (a new dict; the input is untouched).
    Tool-call names and ids are not text: they are the client's identifiers, kept as sent."""
    out = dict(message)
    content = message.get("content")
    if isinstance(content, str):
        out["content"] = fn(content)
    elif isinstance(content, list):
        out["content"] = [{**p, "text": fn(p.get("text", ""))} if p.get("type") == "text" else p for p in content]
    calls = message.get("tool_calls")
    if calls:
        out["tool_calls"] = [
            {**c, "function": {**c["function"], "arguments": fn(c["function"].get("arguments", ""))}} for c in calls
        ]
    return out


def text_chars(messages: Sequence[Message]) -> int:
    return sum(len(t) for m in messages for t in texts(m))


def joined_text(message: Message) -> str:
    """The message's content texts joined (what a text-only backend reads)."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if p.get("type") == "text")
    return ""


def image_parts(messages: Sequence[Message]) -> Iterator[dict[str, Any]]:
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image_url":
                    yield part


def uses_tools(messages: Sequence[Message]) -> bool:
    return any(m.get("role") == "tool" or m.get("tool_calls") for m in messages)


def is_data_url(url: str) -> bool:
    return url.startswith("data:")
