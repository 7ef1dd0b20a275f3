"""Amazon Titan Text Embeddings v2 on Bedrock (`amazon.titan-embed-text-v2:0`) through boto3's
`bedrock-runtime` `invoke_model`, one call per input, run on the provider's own threads (boto3
is synchronous, and Titan embeds one text per call: `providers.blocking_calls`).

Body `{"inputText", "dimensions", "normalize": true}`, answer `{"embedding",
"inputTextTokenCount"}`. At most `concurrency` calls of one request run at once, so a request
of 2,048 inputs cannot take every thread of the replica. Errors are classified as the Converse
adapter classifies them. `endpoint_url` (the provider's `base_url`) points tests at a local
server.
"""

from __future__ import annotations

import asyncio
import json
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)

from switchyard.gateway import json_text
from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import EmbeddingCall, Embeddings, ProviderError
from switchyard.gateway.providers.bedrock_converse import _client_error, bedrock_runtime_client
from switchyard.gateway.providers.blocking_calls import MAX_CALLS, BlockingCalls, withdraw
from switchyard.policy.models import ErrorClass

TITAN_DIMENSIONS = (256, 512, 1024)
TITAN_DEFAULT_DIMENSIONS = 1024


@dataclass
class _Progress:
    """How far one request's calls got: what AWS may bill when one of them fails."""

    calls: list[Future[Any]] = field(default_factory=list)  # submitted to the provider's threads
    failed: int = 0


class BedrockEmbeddingsProvider:
    def __init__(
        self,
        name: str,
        region: str | None,
        endpoint_url: str | None,
        timeout_s: float,
        *,
        concurrency: int = 8,
        max_calls: int = MAX_CALLS,
    ) -> None:
        self.name = name
        self._concurrency = concurrency
        self._client = bedrock_runtime_client(region, endpoint_url, timeout_s)
        self._calls = BlockingCalls(name, max_calls)

    async def embed(self, call: EmbeddingCall) -> Embeddings:
        dimensions = call.dimensions or TITAN_DEFAULT_DIMENSIONS
        if dimensions not in TITAN_DIMENSIONS:
            raise ProviderError(
                ErrorClass.BAD_REQUEST,
                f"{self.name}: Titan Text Embeddings v2 makes vectors of {', '.join(map(str, TITAN_DIMENSIONS))} "
                "dimensions only",
            )
        gate = asyncio.Semaphore(self._concurrency)
        progress = _Progress()

        async def one(text: str) -> tuple[tuple[float, ...], int | None]:
            async with gate:
                job = self._calls.submit(self._invoke, call.model_version, text, dimensions)
                progress.calls.append(job)
                try:
                    return await asyncio.wrap_future(job)
                except ProviderError:
                    progress.failed += 1
                    raise

        tasks = [asyncio.ensure_future(one(text)) for text in call.inputs]
        try:
            results = await asyncio.gather(*tasks)
        except ProviderError as exc:
            for task in tasks:
                task.cancel()  # the calls not submitted yet are never made
            # Calls that answered, or are still running in their threads, are billed by AWS;
            # those still waiting for a thread are withdrawn, never sent.
            sent = sum(withdraw(job) for job in progress.calls)
            billed = exc.billed or sent > progress.failed
            raise ProviderError(
                exc.error_class, exc.message, status=exc.status, retry_after_s=exc.retry_after_s, billed=billed
            ) from None
        except BaseException:
            for task in tasks:
                task.cancel()
            for job in progress.calls:
                withdraw(job)  # the caller is gone: nothing more is sent
            raise
        counts = [tokens for _, tokens in results]
        reported = all(n is not None for n in counts)
        return Embeddings(
            tuple(vector for vector, _ in results),
            sum(n or 0 for n in counts),
            call.model_version,
            usage_reported=reported,
        )

    def _invoke(self, model_id: str, text: str, dimensions: int) -> tuple[tuple[float, ...], int | None]:
        """One Titan call, in a worker thread: (vector, input tokens if reported)."""
        body = json.dumps({"inputText": text, "dimensions": dimensions, "normalize": True})
        try:
            resp = self._client.invoke_model(
                modelId=model_id, body=body, contentType="application/json", accept="application/json"
            )
        except ClientError as exc:
            raise _client_error(self.name, exc) from None
        except (ReadTimeoutError, ConnectTimeoutError):
            raise ProviderError(ErrorClass.TIMEOUT, f"{self.name} timed out") from None
        except EndpointConnectionError:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} connection failed") from None
        except BotoCoreError as exc:
            raise ProviderError(ErrorClass.CONNECTION, f"{self.name} failed ({type(exc).__name__})") from None
        try:
            data: Any = json_text.loads(resp["body"].read())
            vector = tuple(answers.vector_component(x) for x in data["embedding"])
        except BotoCoreError as exc:  # the answer was cut off while it was read: billed all the same
            raise ProviderError(
                ErrorClass.SERVER_ERROR, f"{self.name} answer was cut off ({type(exc).__name__})", billed=True
            ) from None
        except answers.MALFORMED:
            raise answers.malformed(self.name) from None
        return vector, answers.token_count(data.get("inputTextTokenCount"))

    async def aclose(self) -> None:
        self._calls.close()
        self._client.close()
