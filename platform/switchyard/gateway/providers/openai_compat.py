"""OpenAI-compatible chat completions over HTTP (OpenAI, Azure OpenAI v1, vLLM, Ray Serve LLM).

One keep-alive pool per provider (`upstream_http`); the per-attempt timeout comes from the
caller's remaining deadline.

The gateway's call is already in this format, so each field is sent as it is: `messages`
(text and image parts, assistant `tool_calls`, `tool` messages), `tools`, `tool_choice`,
`parallel_tool_calls`, `temperature`, `top_p`, `stop`, `max_tokens`. `output` becomes
`response_format`: `json_schema` (name, schema, strict) when the call asks for it natively
with a schema, else `json_object` (the gateway's output contract checks the schema).

Answers: `message.tool_calls` become `ToolCall`s (content may then be null); streamed
`delta.tool_calls` become `ToolCallDelta`s as they arrive.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any

from switchyard.gateway import json_text
from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import (
    Completion,
    Delta,
    OutputFormat,
    ProviderCall,
    ProviderError,
    ToolCall,
    ToolCallDelta,
    classify_status,
    retry_after_seconds,
)
from switchyard.gateway.providers.http_errors import upstream_detail
from switchyard.gateway.providers.upstream_http import UpstreamHTTP
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass


class OpenAICompatProvider:
    def __init__(self, name: str, base_url: str, api_key: str | None, *, max_connections: int = 100) -> None:
        self.name = name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = UpstreamHTTP(name, base_url, headers, max_connections)

    def _body(self, call: ProviderCall, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": call.model_version,
            "messages": call.messages,
            "max_tokens": call.max_tokens,
        }
        if call.temperature is not None:
            body["temperature"] = call.temperature
        if call.top_p is not None:
            body["top_p"] = call.top_p
        if call.stop:
            body["stop"] = call.stop
        if call.tools:
            body["tools"] = list(call.tools)
        if call.tool_choice is not None:
            body["tool_choice"] = call.tool_choice
        if call.parallel_tool_calls is not None:
            body["parallel_tool_calls"] = call.parallel_tool_calls
        if call.output is not None:
            body["response_format"] = _response_format(call.output)
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def complete(self, call: ProviderCall) -> Completion:
        resp = await self._http.post(
            "chat/completions", self._body(call, False), call.timeout_s, answers.chat_answer_bytes(call.max_tokens)
        )
        if resp.status != 200:
            raise self._status_error(resp.status, resp.text, resp.headers)
        try:
            data = resp.json()
        except ValueError:
            raise answers.malformed(self.name) from None
        return read_chat_completion(self.name, data, call.model_version)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        async with self._http.stream(
            "chat/completions", self._body(call, True), call.timeout_s, answers.chat_answer_bytes(call.max_tokens)
        ) as resp:
            if resp.status != 200:
                error = await resp.read()
                raise self._status_error(error.status, error.text, error.headers)
            usage: Usage | None = None
            finish: str | None = None
            async for line in resp.lines():
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    yield Delta(finish_reason=finish or "stop", usage=usage)
                    return
                chunk = _json_chunk(self.name, payload)
                try:
                    if chunk.get("usage"):  # unreadable counts: billed at the bound, as none
                        usage = _usage(chunk["usage"])
                    deltas = []
                    for choice in answers.array(chunk.get("choices") or [], "choices"):
                        choice = answers.obj(choice, "choice")
                        if choice.get("finish_reason") is not None:
                            finish = answers.finish_reason(choice["finish_reason"])
                        deltas.append(_delta(answers.obj(choice.get("delta") or {}, "delta")))
                except answers.MALFORMED:
                    raise answers.malformed(self.name, "stream event") from None
                for delta in deltas:
                    if delta.text or delta.tool_calls:
                        yield delta
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} stream ended without [DONE]")

    def _status_error(self, status: int, text: str, headers: Mapping[str, str]) -> ProviderError:
        detail = upstream_detail(text)
        return ProviderError(
            classify_status(status, detail),
            f"{self.name} answered HTTP {status}" + (f" ({detail})" if detail else ""),
            status=status,
            retry_after_s=retry_after_seconds(headers.get("retry-after")),
        )

    async def aclose(self) -> None:
        await self._http.aclose()


def read_chat_completion(provider: str, data: Any, asked: str) -> Completion:
    """An OpenAI chat completion (parsed JSON, or the dict an in-cluster deployment returns),
    read field by field (`answers`); `asked` is the model id the call named."""
    try:
        answer = answers.obj(data, "the answer")
        choice = answers.obj(answers.array(answer["choices"], "choices")[0], "choices[0]")
        message = answers.obj(choice["message"], "message")
        text = answers.text(message.get("content"), "message.content")
        calls = tuple(_tool_call(c) for c in answers.array(message.get("tool_calls") or [], "tool_calls"))
        finish = answers.finish_reason(choice.get("finish_reason"))
    except answers.MALFORMED:
        raise answers.malformed(provider) from None
    if finish == "content_filter":
        raise ProviderError(ErrorClass.CONTENT_FILTER, f"{provider} filtered the answer")
    usage = _usage(answer.get("usage"))
    return Completion(
        text,
        usage or Usage(0, 0),
        finish,
        answers.model_id(answer.get("model"), asked),
        usage_reported=usage is not None,
        tool_calls=calls,
    )


def _usage(u: Any) -> Usage | None:
    """The usage an answer or a stream's last chunk states; None when it states none whole."""
    if not isinstance(u, dict):
        return None
    details = u.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return answers.usage(u.get("prompt_tokens"), u.get("completion_tokens"), cached)


def _response_format(output: OutputFormat) -> dict[str, Any]:
    if output.native and output.schema is not None:
        schema = {"name": output.name, "schema": output.schema, "strict": output.strict}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_object"}


def _tool_call(call: Any) -> ToolCall:
    fn = answers.obj(answers.obj(call, "tool_calls[]")["function"], "tool_calls[].function")
    call_id, name, arguments = call["id"], fn["name"], fn.get("arguments") or ""
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise answers.Malformed("a tool call's id, name or arguments is not a string")
    return ToolCall(call_id, name, arguments)


def _delta(delta: dict[str, Any]) -> Delta:
    calls = tuple(_tool_call_delta(c) for c in answers.array(delta.get("tool_calls") or [], "delta.tool_calls"))
    return Delta(text=answers.text(delta.get("content"), "delta.content"), tool_calls=calls)


def _tool_call_delta(piece: dict[str, Any]) -> ToolCallDelta:
    """One `delta.tool_calls` entry: the first piece of a call has its id and name."""
    piece = answers.obj(piece, "delta.tool_calls[]")
    fn = answers.obj(piece.get("function") or {}, "delta.tool_calls[].function")
    call_id, name, arguments = piece.get("id"), fn.get("name"), fn.get("arguments") or ""
    if not isinstance(arguments, str) or not all(v is None or isinstance(v, str) for v in (call_id, name)):
        raise answers.Malformed("a tool call delta's id, name or arguments is not a string")
    index = answers.index(piece.get("index"), "a tool call delta's index")
    return ToolCallDelta(index, id=call_id, name=name, arguments=arguments)


def _json_chunk(name: str, payload: str) -> dict[str, Any]:
    try:
        chunk = answers.obj(json_text.loads(payload), "a stream event")
    except answers.MALFORMED:
        raise answers.malformed(name, "stream event") from None
    if "error" in chunk:
        raise answers.ErrorEvent(name)
    return chunk
