"""OpenAI's embeddings wire format as the gateway accepts and answers it (`POST /v1/embeddings`).

The body is OpenAI's `EmbeddingCreateParams`: `model`, `input`, `encoding_format`, `dimensions`,
`user`; any other field is a 400 naming it. Errors name the field's JSON path and the rule,
never the value sent (the JSON decoding and its limits are `wire.py`'s, shared with chat).

Token-id input (a list of ints, or of lists of ints) is refused, though it could be priced
exactly (one token per id): the gateway could neither redact it per the flow's data class nor
store it in the audit log as the class says, and the non-OpenAI embedders take text only.
"""

from __future__ import annotations

import base64
import struct
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from switchyard.gateway.errors import BadRequest, json_path
from switchyard.gateway.wire import _decode_json, _field_loc

MAX_INPUTS = 2048  # OpenAI's limit per request


class EmbeddingRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = Field(default=None, gt=0)
    user: str | None = None


def parse_embedding_request(raw: bytes) -> tuple[EmbeddingRequest, tuple[str, ...]]:
    """The request and its input texts, in order: 1 to `MAX_INPUTS` non-empty strings."""
    data = _decode_json(raw)
    if not isinstance(data, dict):
        raise BadRequest("invalid_json", "request body must be a JSON object")
    try:
        request = EmbeddingRequest.model_validate(data)
    except ValidationError as exc:
        # include_input=False: pydantic would otherwise echo `input_value`, i.e. request content.
        first = exc.errors(include_input=False, include_url=False, include_context=False)[0]
        path = json_path(_field_loc(first["loc"]))
        if path.startswith("input"):  # pydantic names one union member; say what is accepted
            raise BadRequest("invalid_request", f"input: {_INPUT_RULE}", param="input") from None
        raise BadRequest("invalid_request", f"{path}: {first['msg']}", param=path) from None
    return request, _texts(request.input)


_INPUT_RULE = f"must be a non-empty string or a list of 1 to {MAX_INPUTS} non-empty strings"


def _texts(value: str | list[str] | list[int] | list[list[int]]) -> tuple[str, ...]:
    if isinstance(value, str):
        if not value:
            raise BadRequest("invalid_request", f"input: {_INPUT_RULE}", param="input")
        return (value,)
    if not value:
        raise BadRequest("invalid_request", f"input: {_INPUT_RULE}", param="input")
    if not all(isinstance(v, str) for v in value):
        raise BadRequest(
            "token_input_unsupported",
            "input: token ids are not accepted: the gateway redacts and audits inputs as text; send strings",
            param="input",
        )
    if len(value) > MAX_INPUTS:
        raise BadRequest(
            "too_many_inputs", f"input: at most {MAX_INPUTS} inputs per request, got {len(value)}", param="input"
        )
    texts = tuple(str(v) for v in value)
    for i, text in enumerate(texts):
        if not text:
            raise BadRequest("invalid_request", f"input[{i}]: must not be empty", param=f"input[{i}]")
    return texts


def embeddings_body(
    model: str, vectors: Sequence[Sequence[float]], prompt_tokens: int, encoding: Literal["float", "base64"]
) -> dict[str, Any]:
    """OpenAI's `CreateEmbeddingResponse`; `model` is the catalog name the client may send."""

    def encode(vector: Sequence[float]) -> list[float] | str:
        return _base64(vector) if encoding == "base64" else list(vector)

    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": encode(v)} for i, v in enumerate(vectors)],
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }


def _base64(vector: Sequence[float]) -> str:
    """Little-endian float32 (explicitly, whatever the host's byte order), as OpenAI sends it
    and its SDK decodes it."""
    packed = struct.pack(f"<{len(vector)}f", *vector)
    return base64.b64encode(packed).decode("ascii")
