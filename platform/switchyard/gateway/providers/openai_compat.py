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

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

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
        resp = await self._http.post("chat/completions", self._body(call, False), call.timeout_s)
        if resp.status != 200:
            raise self._status_error(resp.status, resp.text, resp.headers)
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            calls = tuple(_tool_call(c) for c in choice["message"].get("tool_calls") or ())
            usage = _usage(data.get("usage") or {})
            finish = choice.get("finish_reason") or "stop"
        except (ValueError, KeyError, IndexError, TypeError, AttributeError):
            # A 200 is an answer the provider may bill, however broken: charged at the bound.
            raise ProviderError(
                ErrorClass.SERVER_ERROR, f"{self.name} returned a malformed response", billed=True
            ) from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTER, f"{self.name} filtered the answer")
        reported = isinstance(data.get("usage"), dict)
        model_version = data.get("model") or call.model_version
        return Completion(text, usage, finish, model_version, usage_reported=reported, tool_calls=calls)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        async with self._http.stream("chat/completions", self._body(call, True), call.timeout_s) as resp:
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
                if chunk.get("usage"):
                    usage = _usage(chunk["usage"])
                for choice in chunk.get("choices") or []:
                    finish = choice.get("finish_reason") or finish
                    delta = _delta(self.name, choice.get("delta") or {})
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


def _usage(u: dict[str, Any]) -> Usage:
    details = u.get("prompt_tokens_details") or {}
    return Usage(
        int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)), int(details.get("cached_tokens") or 0)
    )


def _response_format(output: OutputFormat) -> dict[str, Any]:
    if output.native and output.schema is not None:
        schema = {"name": output.name, "schema": output.schema, "strict": output.strict}
        return {"type": "json_schema", "json_schema": schema}
    return {"type": "json_object"}


def _tool_call(call: dict[str, Any]) -> ToolCall:
    fn = call["function"]
    call_id, name, arguments = call["id"], fn["name"], fn.get("arguments") or ""
    if not isinstance(call_id, str) or not isinstance(name, str) or not isinstance(arguments, str):
        raise TypeError("tool call")
    return ToolCall(call_id, name, arguments)


def _delta(name: str, delta: dict[str, Any]) -> Delta:
    try:
        calls = tuple(_tool_call_delta(c) for c in delta.get("tool_calls") or ())
        return Delta(text=delta.get("content") or "", tool_calls=calls)
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} sent a malformed stream event") from None


def _tool_call_delta(piece: dict[str, Any]) -> ToolCallDelta:
    """One `delta.tool_calls` entry: the first piece of a call has its id and name."""
    fn = piece.get("function") or {}
    call_id, name, arguments = piece.get("id"), fn.get("name"), fn.get("arguments") or ""
    if not isinstance(arguments, str) or not all(v is None or isinstance(v, str) for v in (call_id, name)):
        raise TypeError("tool call delta")
    return ToolCallDelta(int(piece["index"]), id=call_id, name=name, arguments=arguments)


def _json_chunk(name: str, payload: str) -> dict[str, Any]:
    try:
        chunk = json.loads(payload)
    except ValueError:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} sent a malformed stream event") from None
    if not isinstance(chunk, dict):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} sent a malformed stream event")
    if "error" in chunk:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} reported an error mid-stream")
    return chunk
