"""Amazon Titan Text Embeddings v2 on Bedrock (`amazon.titan-embed-text-v2:0`) through boto3's
`bedrock-runtime` `invoke_model`, one call per input, run in worker threads (boto3 is
synchronous, and Titan embeds one text per call).

Body `{"inputText", "dimensions", "normalize": true}`, answer `{"embedding",
"inputTextTokenCount"}`. At most `concurrency` calls of one request run at once, so a request
of 2,048 inputs cannot take every thread of the replica. Errors are classified as the Converse
adapter classifies them. `endpoint_url` (the provider's `base_url`) points tests at a local
server.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
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
from switchyard.policy.models import ErrorClass

TITAN_DIMENSIONS = (256, 512, 1024)
TITAN_DEFAULT_DIMENSIONS = 1024


@dataclass
class _Progress:
    """How far one request's calls got: what AWS may bill when one of them fails."""

    started: int = 0
    failed: int = 0


class BedrockEmbeddingsProvider:
    def __init__(
        self, name: str, region: str | None, endpoint_url: str | None, timeout_s: float, *, concurrency: int = 8
    ) -> None:
        self.name = name
        self._concurrency = concurrency
        self._client = bedrock_runtime_client(region, endpoint_url, timeout_s)

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
                progress.started += 1
                try:
                    return await asyncio.to_thread(self._invoke, call.model_version, text, dimensions)
                except ProviderError:
                    progress.failed += 1
                    raise

        tasks = [asyncio.ensure_future(one(text)) for text in call.inputs]
        try:
            results = await asyncio.gather(*tasks)
        except ProviderError as exc:
            for task in tasks:
                task.cancel()  # the calls not started yet are never made
            # Calls that answered, or are still running in their threads, are billed by AWS.
            billed = exc.billed or progress.started > progress.failed
            raise ProviderError(
                exc.error_class, exc.message, status=exc.status, retry_after_s=exc.retry_after_s, billed=billed
            ) from None
        except BaseException:
            for task in tasks:
                task.cancel()
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
        self._client.close()
