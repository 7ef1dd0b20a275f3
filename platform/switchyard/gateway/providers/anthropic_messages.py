"""Anthropic's Messages API over HTTP (`POST /v1/messages`), streaming and not.

What each field of the gateway's OpenAI-format call becomes:
- system messages: the top-level `system` (text only), after the conversation is read;
- user / assistant content: `text` blocks; `image_url` parts: `image` blocks (a `data:` URL
  becomes a base64 source with its media type, an `https:` URL a url source; `detail` has no
  counterpart and is not sent);
- assistant `tool_calls`: `tool_use` blocks (`input` is the parsed arguments JSON);
- `tool` messages: `tool_result` blocks in a user turn. Consecutive turns of one role merge
  (tool results, then the user's text, in one user turn), because the API requires user and
  assistant turns to alternate; where two messages' texts meet they join with a blank line;
- `tools`: `{name, description, input_schema, strict}`; `tool_choice` auto / none /
  required (`any`) / a named function (`tool`); `parallel_tool_calls: false`:
  `disable_parallel_tool_use`;
- `output`: natively (`output_config.format`, a `json_schema`) when the call asks for it
  natively with a schema; otherwise a system instruction asking for JSON only (with the
  schema when there is one), and the gateway's output contract checks the answer;
- `stop`: `stop_sequences`. No `temperature` / `top_p`: the Messages API version the pinned
  SDK (anthropic 2.10) describes has no sampling parameters.
Anything else it cannot translate is refused (`bad_request`, naming the field).

Answers: `tool_use` blocks become `ToolCall`s (arguments: the input as JSON text), stop
reason `tool_use` finish `tool_calls`. Streaming: a `tool_use` block's start is a
`ToolCallDelta` with its id and name, its `input_json_delta`s the argument fragments
(`index` counts tool_use blocks only, from 0).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from switchyard.gateway import json_text
from switchyard.gateway.messages import Message
from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import (
    Completion,
    Delta,
    ProviderCall,
    ProviderError,
    ToolCall,
    ToolCallDelta,
    classify_status,
    retry_after_seconds,
)
from switchyard.gateway.providers.openai_format import (
    cannot_honour,
    content_parts,
    function_tools,
    image_url,
    inline_image,
    json_instruction,
    past_tool_calls,
    text_only,
    tool_call_id,
    tool_choice,
    turn_role,
    wants_native_schema,
)
from switchyard.gateway.providers.upstream_http import UpstreamHTTP
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass

API_VERSION = "2023-06-01"
_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "refusal": "content_filter",
    "tool_use": "tool_calls",
}
_CHOICE = {"auto": "auto", "required": "any", "named": "tool"}


def to_messages_api(name: str, call: ProviderCall, stream: bool) -> dict[str, Any]:
    """The Messages API request for `call`; `name` (the provider's) is the one refusals use."""
    body: dict[str, Any] = {
        "model": call.model_version,
        "max_tokens": call.max_tokens,
        "messages": _turns(name, call.messages),
    }
    system = _system(name, call)
    if system:
        body["system"] = system
    # The Messages API version the pinned SDK (anthropic 2.10) describes has no sampling
    # parameters: refused, never dropped (the catalog says so and routing skips the model).
    for field_name in ("temperature", "top_p"):
        if getattr(call, field_name) is not None:
            raise cannot_honour(name, field_name, "this Messages API version has no sampling parameters")
    if call.stop:
        body["stop_sequences"] = call.stop
    body.update(_tools(name, call))
    if wants_native_schema(call.output):
        assert call.output is not None and call.output.schema is not None
        body["output_config"] = {"format": {"type": "json_schema", "schema": call.output.schema}}
    if stream:
        body["stream"] = True
    return body


def _system(name: str, call: ProviderCall) -> str:
    parts = [text_only(name, f"messages[{i}].content", m) for i, m in enumerate(call.messages) if m["role"] == "system"]
    if call.output is not None and not wants_native_schema(call.output):
        parts.append(json_instruction(call.output))
    return "\n\n".join(parts)


def _turns(name: str, messages: list[Message]) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        api_role = turn_role(name, i, m)
        if api_role is None:
            continue
        blocks = _blocks(name, i, m)
        if turns and turns[-1]["role"] == api_role:
            _merge(turns[-1]["content"], blocks)
        else:
            turns.append({"role": api_role, "content": blocks})
    if not turns or turns[0]["role"] != "user":
        # The API requires the conversation to open with a user turn.
        turns.insert(0, {"role": "user", "content": [{"type": "text", "text": "(see instructions)"}]})
    return [_compact(t) for t in turns]


def _blocks(name: str, i: int, m: Message) -> list[dict[str, Any]]:
    field = f"messages[{i}].content"
    if m["role"] == "tool":
        return [{"type": "tool_result", "tool_use_id": tool_call_id(name, i, m), "content": text_only(name, field, m)}]
    if m["role"] == "user":
        return [
            _user_block(name, f, part)
            for f, part in content_parts(name, field, m.get("content"), ("text", "image_url"))
        ]
    calls = past_tool_calls(name, i, m)
    texts = [{"type": "text", "text": p["text"]} for _, p in content_parts(name, field, m.get("content"), ("text",))]
    if calls:
        texts = [t for t in texts if t["text"]]  # the API refuses empty text blocks beside tool_use
    return texts + [{"type": "tool_use", "id": c.id, "name": c.name, "input": c.arguments} for c in calls]


def _user_block(name: str, field: str, part: dict[str, Any]) -> dict[str, Any]:
    if part["type"] == "text":
        return {"type": "text", "text": part.get("text", "")}
    url = image_url(name, field, part)
    if url.startswith("data:"):
        image = inline_image(name, f"{field}.image_url.url", url)
        return {
            "type": "image",
            "source": {"type": "base64", "media_type": image.media_type, "data": image.base64_data},
        }
    if url.startswith("https://"):
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise cannot_honour(name, f"{field}.image_url.url", "only data: and https: image URLs translate")


def _merge(into: list[dict[str, Any]], blocks: list[dict[str, Any]]) -> None:
    """Append one message's blocks to the turn; texts that meet join with a blank line (as
    separate messages read), which keeps a run of plain-string messages one string."""
    if into and blocks and into[-1]["type"] == "text" and blocks[0]["type"] == "text":
        into[-1] = {"type": "text", "text": into[-1]["text"] + "\n\n" + blocks[0]["text"]}
        blocks = blocks[1:]
    into.extend(blocks)


def _compact(turn: dict[str, Any]) -> dict[str, Any]:
    blocks = turn["content"]
    if len(blocks) == 1 and blocks[0]["type"] == "text":
        return {"role": turn["role"], "content": blocks[0]["text"]}
    return turn


def _tools(name: str, call: ProviderCall) -> dict[str, Any]:
    """`tools` and `tool_choice` for the body (none when the call has no tools)."""
    choice = tool_choice(name, call.tool_choice)
    if not call.tools:
        if choice is not None and choice.mode in ("required", "named"):
            raise cannot_honour(name, "tool_choice", "it asks for a tool call but the request has no tools")
        return {}  # auto or none without tools: nothing to choose from
    tools = []
    for tool in function_tools(name, call.tools):
        spec: dict[str, Any] = {"name": tool.name, "input_schema": tool.parameters}
        if tool.description:
            spec["description"] = tool.description
        if tool.strict is not None:
            spec["strict"] = tool.strict
        tools.append(spec)
    mode = choice.mode if choice is not None else "auto"  # OpenAI's default, said explicitly
    if mode == "none":
        return {"tools": tools, "tool_choice": {"type": "none"}}
    api_choice: dict[str, Any] = {"type": _CHOICE[mode]}
    if choice is not None and choice.name:
        api_choice["name"] = choice.name
    if call.parallel_tool_calls is False:
        api_choice["disable_parallel_tool_use"] = True
    return {"tools": tools, "tool_choice": api_choice}


class AnthropicProvider:
    def __init__(self, name: str, base_url: str, api_key: str | None, *, max_connections: int = 100) -> None:
        self.name = name
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        self._http = UpstreamHTTP(name, base_url, headers, max_connections)

    async def complete(self, call: ProviderCall) -> Completion:
        body = to_messages_api(self.name, call, False)
        resp = await self._http.post("v1/messages", body, call.timeout_s, answers.chat_answer_bytes(call.max_tokens))
        if resp.status != 200:
            raise self._status_error(resp.status, resp.text, resp.headers)
        try:
            data = answers.obj(resp.json(), "the answer")
            blocks = [answers.obj(b, "content[]") for b in answers.array(data["content"], "content")]
            text = "".join(answers.text(b["text"], "content[].text") for b in blocks if b.get("type") == "text")
            calls = tuple(_tool_call(b) for b in blocks if b.get("type") == "tool_use")
            finish = answers.mapped_finish(data.get("stop_reason"), _FINISH, "stop_reason")
        except answers.MALFORMED:
            raise answers.malformed(self.name) from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTER, f"{self.name} refused the request")
        u = data.get("usage")
        usage = _usage(u, u.get("output_tokens")) if isinstance(u, dict) else None
        return Completion(
            text,
            usage or Usage(0, 0),
            finish,
            answers.model_id(data.get("model"), call.model_version),
            usage_reported=usage is not None,
            tool_calls=calls,
        )

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        body = to_messages_api(self.name, call, True)
        async with self._http.stream(
            "v1/messages", body, call.timeout_s, answers.chat_answer_bytes(call.max_tokens)
        ) as resp:
            if resp.status != 200:
                error = await resp.read()
                raise self._status_error(error.status, error.text, error.headers)
            reader = _StreamReader()
            async for line in resp.lines():
                if not line.startswith("data:"):
                    continue
                try:
                    event = answers.obj(json_text.loads(line[5:].strip()), "a stream event")
                    if event.get("type") == "error":
                        raise answers.ErrorEvent(self.name)
                    deltas = reader.read(event)
                except answers.MALFORMED:
                    raise answers.malformed(self.name, "stream event") from None
                for delta in deltas:
                    yield delta
                if reader.finished:
                    return
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} stream ended without message_stop")

    def _status_error(self, status: int, text: str, headers: Mapping[str, str]) -> ProviderError:
        err_type, too_long = _error_facts(text)
        # 529 is Anthropic's "overloaded": a capacity problem like 503.
        error_class = ErrorClass.CONTEXT_LENGTH if too_long else classify_status(status, err_type)
        return ProviderError(
            error_class,
            f"{self.name} answered HTTP {status}" + (f" ({err_type})" if err_type else ""),
            status=status,
            retry_after_s=retry_after_seconds(headers.get("retry-after")),
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def _tool_call(block: dict[str, Any]) -> ToolCall:
    call_id, name, arguments = block["id"], block["name"], block["input"]
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, dict):
        raise answers.Malformed("a tool_use block's id, name or input is not what the API sends")
    return ToolCall(call_id, name, json.dumps(arguments))


def _usage(inputs: dict[str, Any], output_tokens: Any) -> Usage | None:
    """The usage of `inputs` (a usage object's input counts) and `output_tokens`."""
    read, written = inputs.get("cache_read_input_tokens"), inputs.get("cache_creation_input_tokens")
    return answers.uncached_usage(inputs.get("input_tokens"), output_tokens, read, written)


class _StreamReader:
    """Turns Messages API stream events into deltas; `finished` after `message_stop`.
    A field that is not what the API sends raises one of `answers.MALFORMED`."""

    def __init__(self) -> None:
        self.usage_start: dict[str, Any] | None = None  # message_start's usage
        self.output_tokens: Any = None  # the last message_delta's count
        self.finish = "stop"
        self.finished = False
        self._tool_of_block: dict[int, int] = {}  # content block index -> tool call index
        self._argued: set[int] = set()  # tool calls that have had an argument fragment

    def read(self, event: dict[str, Any]) -> list[Delta]:
        kind = event.get("type")
        if kind == "message_start":
            start = answers.obj(event["message"], "message").get("usage")
            self.usage_start = start if isinstance(start, dict) else None
        elif kind == "content_block_start":
            block = answers.obj(event["content_block"], "content_block")
            if block.get("type") == "tool_use":
                return [self._tool_start(_block_index(event), block)]
        elif kind == "content_block_delta":
            return self._block_delta(_block_index(event), answers.obj(event["delta"], "delta"))
        elif kind == "content_block_stop" and _block_index(event) in self._tool_of_block:
            tool = self._tool_of_block[_block_index(event)]
            if tool not in self._argued:
                # A call without arguments streams no fragment; its arguments are still JSON.
                return [Delta(tool_calls=(ToolCallDelta(tool, arguments="{}"),))]
        elif kind == "message_delta":
            counts = event.get("usage")
            if isinstance(counts, dict) and "output_tokens" in counts:
                self.output_tokens = counts["output_tokens"]
            reason = answers.obj(event["delta"], "delta").get("stop_reason")
            self.finish = answers.mapped_finish(reason, _FINISH, "delta.stop_reason")
        elif kind == "message_stop":
            self.finished = True
            return [Delta(finish_reason=self.finish, usage=self.usage())]
        return []

    def usage(self) -> Usage | None:
        """The stream's usage: input as message_start stated it, output as the last
        message_delta did; None (billed at the bound) when either is missing or not a count."""
        if self.usage_start is None or self.output_tokens is None:
            return None
        return _usage(self.usage_start, self.output_tokens)

    def _tool_start(self, block: int, content: dict[str, Any]) -> Delta:
        call_id, name = content.get("id"), content.get("name")
        if not isinstance(call_id, str) or not isinstance(name, str):
            raise answers.Malformed("a tool_use block's id or name is not a string")
        tool = len(self._tool_of_block)
        self._tool_of_block[block] = tool
        start_input = content.get("input") or {}
        if not isinstance(start_input, dict):
            raise answers.Malformed("a tool_use block's input is not an object")
        if start_input:
            self._argued.add(tool)
        arguments = json.dumps(start_input) if start_input else ""
        return Delta(tool_calls=(ToolCallDelta(tool, id=call_id, name=name, arguments=arguments),))

    def _block_delta(self, block: int, delta: dict[str, Any]) -> list[Delta]:
        if delta.get("type") == "text_delta":
            return [Delta(text=answers.text(delta["text"], "delta.text"))]
        if delta.get("type") == "input_json_delta" and block in self._tool_of_block:
            fragment = answers.text(delta["partial_json"], "delta.partial_json")
            if not fragment:
                return []
            tool = self._tool_of_block[block]
            self._argued.add(tool)
            return [Delta(tool_calls=(ToolCallDelta(tool, arguments=fragment),))]
        return []


def _block_index(event: dict[str, Any]) -> int:
    return answers.index(event["index"], "a content block's index")


def _error_facts(text: str) -> tuple[str, bool]:
    """The error type, and whether the message says the prompt is too long (message not kept)."""
    try:
        err = json_text.loads(text).get("error") or {}
    except (ValueError, AttributeError):
        return "", False
    if not isinstance(err, dict):
        return "", False
    message = str(err.get("message", "")).lower()
    return str(err.get("type", ""))[:60], "too long" in message or ("context" in message and "exceed" in message)
