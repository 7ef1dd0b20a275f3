"""OpenAI-compatible chat completions over HTTP (OpenAI, Azure OpenAI v1, vLLM, Ray Serve LLM).

One pooled `httpx.AsyncClient` per provider; the per-attempt timeout comes from the caller's
remaining deadline.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from switchyard.gateway.providers.base import (
    Completion,
    Delta,
    ProviderCall,
    ProviderError,
    classify_status,
    retry_after_seconds,
)
from switchyard.gateway.providers.http_errors import transport_error, upstream_detail
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass


class OpenAICompatProvider:
    def __init__(self, name: str, base_url: str, api_key: str | None, *, max_connections: int = 100) -> None:
        self.name = name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

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
        if call.json_output:
            body["response_format"] = {"type": "json_object"}
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        return body

    async def complete(self, call: ProviderCall) -> Completion:
        try:
            resp = await self._client.post("chat/completions", json=self._body(call, False), timeout=call.timeout_s)
        except httpx.HTTPError as exc:
            raise transport_error(self.name, exc) from None
        if resp.status_code != 200:
            raise self._status_error(resp.status_code, resp.text, resp.headers)
        try:
            data = resp.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
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
        return Completion(text, usage, finish, data.get("model") or call.model_version, usage_reported=reported)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        try:
            async with self._client.stream(
                "POST", "chat/completions", json=self._body(call, True), timeout=call.timeout_s
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise self._status_error(resp.status_code, resp.text, resp.headers)
                usage: Usage | None = None
                finish: str | None = None
                async for line in resp.aiter_lines():
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
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            yield Delta(text=text)
                raise ProviderError(ErrorClass.CONNECTION, f"{self.name} stream ended without [DONE]")
        except httpx.HTTPError as exc:
            raise transport_error(self.name, exc) from None

    def _status_error(self, status: int, text: str, headers: httpx.Headers) -> ProviderError:
        detail = upstream_detail(text)
        return ProviderError(
            classify_status(status, detail),
            f"{self.name} answered HTTP {status}" + (f" ({detail})" if detail else ""),
            status=status,
            retry_after_s=retry_after_seconds(headers.get("retry-after")),
        )

    async def aclose(self) -> None:
        await self._client.aclose()


def _usage(u: dict[str, Any]) -> Usage:
    details = u.get("prompt_tokens_details") or {}
    return Usage(
        int(u.get("prompt_tokens", 0)), int(u.get("completion_tokens", 0)), int(details.get("cached_tokens") or 0)
    )


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
