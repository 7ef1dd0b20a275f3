"""Anthropic's Messages API over HTTP (`POST /v1/messages`), streaming and not.

System messages become the top-level `system`; consecutive turns of one role are merged,
because the API requires user and assistant turns to alternate.
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
from switchyard.gateway.providers.http_errors import transport_error
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass

API_VERSION = "2023-06-01"
_FINISH = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "refusal": "content_filter"}


def to_messages_api(call: ProviderCall, stream: bool) -> dict[str, Any]:
    system = "\n\n".join(m["content"] for m in call.messages if m["role"] == "system")
    turns: list[dict[str, str]] = []
    for m in call.messages:
        if m["role"] == "system":
            continue
        if turns and turns[-1]["role"] == m["role"]:
            turns[-1] = {"role": m["role"], "content": turns[-1]["content"] + "\n\n" + m["content"]}
        else:
            turns.append({"role": m["role"], "content": m["content"]})
    if not turns or turns[0]["role"] != "user":
        # The API requires the conversation to open with a user turn.
        turns.insert(0, {"role": "user", "content": "(see instructions)"})
    body: dict[str, Any] = {"model": call.model_version, "max_tokens": call.max_tokens, "messages": turns}
    if system:
        body["system"] = system
    # No temperature/top_p: the Messages API version the pinned SDK (anthropic 2.10) describes
    # has no sampling parameters, and the fake upstream rejects fields that SDK does not know.
    if call.stop:
        body["stop_sequences"] = call.stop
    if stream:
        body["stream"] = True
    return body


class AnthropicProvider:
    def __init__(self, name: str, base_url: str, api_key: str | None, *, max_connections: int = 100) -> None:
        self.name = name
        headers = {"anthropic-version": API_VERSION}
        if api_key:
            headers["x-api-key"] = api_key
        self._client = httpx.AsyncClient(
            base_url=base_url.rstrip("/") + "/",
            headers=headers,
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def complete(self, call: ProviderCall) -> Completion:
        try:
            resp = await self._client.post("v1/messages", json=to_messages_api(call, False), timeout=call.timeout_s)
        except httpx.HTTPError as exc:
            raise transport_error(self.name, exc) from None
        if resp.status_code != 200:
            raise self._status_error(resp.status_code, resp.text, resp.headers)
        try:
            data = resp.json()
            text = "".join(b["text"] for b in data["content"] if b.get("type") == "text")
            u = data["usage"]
            usage = Usage(int(u["input_tokens"]), int(u["output_tokens"]), int(u.get("cache_read_input_tokens") or 0))
            finish = _FINISH.get(data.get("stop_reason") or "end_turn", "stop")
        except (ValueError, KeyError, TypeError, AttributeError):
            # A 200 is an answer the provider may bill, however broken: charged at the bound.
            raise ProviderError(
                ErrorClass.SERVER_ERROR, f"{self.name} returned a malformed response", billed=True
            ) from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTER, f"{self.name} refused the request")
        return Completion(text, usage, finish, data.get("model") or call.model_version)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        try:
            async with self._client.stream(
                "POST", "v1/messages", json=to_messages_api(call, True), timeout=call.timeout_s
            ) as resp:
                if resp.status_code != 200:
                    await resp.aread()
                    raise self._status_error(resp.status_code, resp.text, resp.headers)
                input_tokens, output_tokens, finish = 0, 0, "stop"
                async for line in resp.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    event = _event(self.name, line[5:].strip())
                    kind = event.get("type")
                    if kind == "message_start":
                        input_tokens = int(event["message"]["usage"]["input_tokens"])
                    elif kind == "content_block_delta" and event["delta"].get("type") == "text_delta":
                        yield Delta(text=event["delta"]["text"])
                    elif kind == "message_delta":
                        output_tokens = int(event.get("usage", {}).get("output_tokens", output_tokens))
                        finish = _FINISH.get(event["delta"].get("stop_reason") or "end_turn", "stop")
                    elif kind == "message_stop":
                        yield Delta(finish_reason=finish, usage=Usage(input_tokens, output_tokens))
                        return
                    elif kind == "error":
                        raise ProviderError(ErrorClass.SERVER_ERROR, f"{self.name} reported an error mid-stream")
                raise ProviderError(ErrorClass.CONNECTION, f"{self.name} stream ended without message_stop")
        except httpx.HTTPError as exc:
            raise transport_error(self.name, exc) from None
        except (KeyError, TypeError):
            raise ProviderError(ErrorClass.SERVER_ERROR, f"{self.name} sent a malformed stream event") from None

    def _status_error(self, status: int, text: str, headers: httpx.Headers) -> ProviderError:
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
        await self._client.aclose()


def _error_facts(text: str) -> tuple[str, bool]:
    """The error type, and whether the message says the prompt is too long (message not kept)."""
    try:
        err = json.loads(text).get("error") or {}
    except (ValueError, AttributeError):
        return "", False
    if not isinstance(err, dict):
        return "", False
    message = str(err.get("message", "")).lower()
    return str(err.get("type", ""))[:60], "too long" in message or ("context" in message and "exceed" in message)


def _event(name: str, payload: str) -> dict[str, Any]:
    try:
        event = json.loads(payload)
    except ValueError:
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} sent a malformed stream event") from None
    if not isinstance(event, dict):
        raise ProviderError(ErrorClass.SERVER_ERROR, f"{name} sent a malformed stream event")
    return event
