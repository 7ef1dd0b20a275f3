"""OpenAI-compatible embeddings over HTTP (`POST {base_url}/embeddings`: OpenAI, Azure OpenAI
v1, vLLM), and OpenAI's embeddings response shape, which in-cluster deployments answer in too
(`switchyard.cluster.serve_handle`, `serve_apps/local_model.py`).

One keep-alive pool per provider (`upstream_http`); the per-attempt timeout is the caller's. Floats
are asked for (`encoding_format: "float"`) whatever the client wants: the gateway checks every
vector's shape before answering and encodes base64 itself, so one parser serves every client.
"""

from __future__ import annotations

from typing import Any

from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import (
    EmbeddingCall,
    Embeddings,
    ProviderError,
    classify_status,
    retry_after_seconds,
)
from switchyard.gateway.providers.http_errors import upstream_detail
from switchyard.gateway.providers.upstream_http import UpstreamHTTP
from switchyard.policy.models import ErrorClass


class OpenAIEmbeddingsProvider:
    def __init__(self, name: str, base_url: str, api_key: str | None, *, max_connections: int = 100) -> None:
        self.name = name
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = UpstreamHTTP(name, base_url, headers, max_connections)

    async def embed(self, call: EmbeddingCall) -> Embeddings:
        # A read timeout (the request sent whole) is billed at the bound: see `upstream_http`.
        resp = await self._http.post(
            "embeddings", request_body(call), call.timeout_s, answers.embeddings_answer_bytes(len(call.inputs))
        )
        if resp.status != 200:
            detail = upstream_detail(resp.text)
            raise ProviderError(
                classify_status(resp.status, detail),
                f"{self.name} answered HTTP {resp.status}" + (f" ({detail})" if detail else ""),
                status=resp.status,
                retry_after_s=retry_after_seconds(resp.headers.get("retry-after")),
            )
        try:
            data = resp.json()
        except ValueError:
            raise _malformed(self.name, "a body that is not JSON") from None
        return parse_embeddings(self.name, data, call)

    async def aclose(self) -> None:
        await self._http.aclose()


def request_body(call: EmbeddingCall) -> dict[str, Any]:
    """OpenAI's embeddings request for `call` (`user` is never sent: end users stay ours)."""
    body: dict[str, Any] = {"model": call.model_version, "input": list(call.inputs), "encoding_format": "float"}
    if call.dimensions is not None:
        body["dimensions"] = call.dimensions
    return body


def parse_embeddings(name: str, data: Any, call: EmbeddingCall) -> Embeddings:
    """The vectors of an OpenAI embeddings response, in input order.

    `{"error": {...}}` (a deployment refusing an input) raises its class, unbilled. Anything
    else that is not one vector of numbers per input index is a malformed answer:
    `server_error`, billed (a 200 the provider may have charged for). The vectors' sizes are
    the pipeline's to check, for every provider alike."""
    if isinstance(data, dict) and isinstance(data.get("error"), dict):
        err = data["error"]
        detail = "/".join(str(err[k]) for k in ("type", "code") if isinstance(err.get(k), str))[:120]
        # The error's message is not repeated: a provider's message may quote the input back.
        raise ProviderError(
            classify_status(400, detail), f"{name} refused the input" + (f" ({detail})" if detail else "")
        )
    try:
        rows = sorted(data["data"], key=_index)
        indices = [_index(row) for row in rows]
        vectors = tuple(tuple(answers.vector_component(x) for x in row["embedding"]) for row in rows)
    except answers.MALFORMED:
        raise _malformed(name, "a response that is not OpenAI's embeddings shape") from None
    if indices != list(range(len(call.inputs))):
        raise _malformed(name, f"{len(indices)} vectors for {len(call.inputs)} inputs")
    usage = data.get("usage")
    tokens = answers.token_count(usage.get("prompt_tokens")) if isinstance(usage, dict) else None
    model_version = answers.model_id(data.get("model"), call.model_version)
    return Embeddings(vectors, tokens or 0, model_version, usage_reported=tokens is not None)


def _index(row: Any) -> int:
    return answers.index(answers.obj(row, "data[]")["index"], "data[].index")


def _malformed(name: str, what: str) -> ProviderError:
    return ProviderError(ErrorClass.SERVER_ERROR, f"{name} returned {what}", billed=True)
