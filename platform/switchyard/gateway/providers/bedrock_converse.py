"""AWS Bedrock's Converse API through boto3, run in a worker thread (boto3 is synchronous).

`endpoint_url` (the provider's `base_url` in policy) points tests at a local server.
Streaming uses Converse (not ConverseStream) and yields the answer as one delta: the
fallback rules are the same, and clients still receive a valid SSE stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from switchyard.gateway.providers.base import Completion, Delta, ProviderCall, ProviderError
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass

_FINISH = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "content_filtered": "content_filter",
    "guardrail_intervened": "content_filter",
}
_ERRORS = {
    "ThrottlingException": ErrorClass.RATE_LIMITED,
    "ServiceQuotaExceededException": ErrorClass.RATE_LIMITED,
    "ModelTimeoutException": ErrorClass.TIMEOUT,
    "InternalServerException": ErrorClass.SERVER_ERROR,
    "ServiceUnavailableException": ErrorClass.SERVER_ERROR,
    "ModelNotReadyException": ErrorClass.SERVER_ERROR,
    "ModelErrorException": ErrorClass.SERVER_ERROR,
    "AccessDeniedException": ErrorClass.SERVER_ERROR,
    "ResourceNotFoundException": ErrorClass.SERVER_ERROR,
}


def to_converse(call: ProviderCall) -> dict[str, Any]:
    system = [{"text": m["content"]} for m in call.messages if m["role"] == "system"]
    turns: list[dict[str, Any]] = []
    for m in call.messages:
        if m["role"] == "system":
            continue
        if turns and turns[-1]["role"] == m["role"]:
            turns[-1]["content"].append({"text": m["content"]})
        else:
            turns.append({"role": m["role"], "content": [{"text": m["content"]}]})
    if not turns or turns[0]["role"] != "user":
        turns.insert(0, {"role": "user", "content": [{"text": "(see instructions)"}]})
    inference: dict[str, Any] = {"maxTokens": call.max_tokens}
    if call.temperature is not None:
        inference["temperature"] = min(call.temperature, 1.0)
    if call.top_p is not None:
        inference["topP"] = call.top_p
    if call.stop:
        inference["stopSequences"] = call.stop
    params: dict[str, Any] = {"modelId": call.model_version, "messages": turns, "inferenceConfig": inference}
    if system:
        params["system"] = system
    return params


class BedrockProvider:
    def __init__(self, name: str, region: str | None, endpoint_url: str | None, timeout_s: float) -> None:
        self.name = name
        config = Config(
            retries={"total_max_attempts": 1, "mode": "standard"},  # the gateway retries, with its deadline
            connect_timeout=min(timeout_s, 10.0),
            read_timeout=timeout_s,
            max_pool_connections=50,
        )
        self._client = boto3.client(
            "bedrock-runtime", region_name=region or "us-east-1", endpoint_url=endpoint_url, config=config
        )

    async def complete(self, call: ProviderCall) -> Completion:
        try:
            resp = await asyncio.wait_for(
                asyncio.to_thread(self._client.converse, **to_converse(call)), timeout=call.timeout_s
            )
        except TimeoutError:
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out") from None
        except ClientError as exc:
            raise _client_error(self.name, exc) from None
        except (ReadTimeoutError, ConnectTimeoutError):
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out") from None
        except EndpointConnectionError:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} connection failed") from None
        except BotoCoreError as exc:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} failed ({type(exc).__name__})") from None
        try:
            text = "".join(b.get("text", "") for b in resp["output"]["message"]["content"])
            u = resp["usage"]
            usage = Usage(int(u["inputTokens"]), int(u["outputTokens"]), int(u.get("cacheReadInputTokens") or 0))
            finish = _FINISH.get(resp.get("stopReason", "end_turn"), "stop")
        except (KeyError, TypeError, AttributeError):
            raise ProviderError(ErrorClass.SERVER_ERROR, f"{self.name} returned a malformed response") from None
        if finish == "content_filter":
            raise ProviderError(ErrorClass.CONTENT_FILTER, f"{self.name} filtered the answer")
        return Completion(text, usage, finish, call.model_version)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        done = await self.complete(call)
        yield Delta(text=done.text)
        yield Delta(finish_reason=done.finish_reason, usage=done.usage)

    async def aclose(self) -> None:
        self._client.close()


def _client_error(name: str, exc: ClientError) -> ProviderError:
    err = exc.response.get("Error", {})
    code = str(err.get("Code", ""))
    status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
    error_class = _ERRORS.get(code)
    if error_class is None:
        message = str(err.get("Message", "")).lower()
        if code == "ValidationException" and ("too long" in message or "context" in message):
            error_class = ErrorClass.CONTEXT_LENGTH
        elif status >= 500:
            error_class = ErrorClass.SERVER_ERROR
        else:
            error_class = ErrorClass.BAD_REQUEST
    return ProviderError(error_class, f"{name} answered {code or 'an error'} (HTTP {status})", status=status)
