"""The OpenAI chat-completions wire format as the gateway accepts and answers it.

Only the fields the gateway can honour are accepted; unknown fields are a 400 naming the
field (a silently ignored `tools` would be a worse surprise). Prompt variables and an
optional prompt version travel in `extra_body` (`variables`, `prompt_version`).
"""

from __future__ import annotations

import json
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from switchyard.gateway.errors import BadRequest
from switchyard.gateway.seams import Usage


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ClientMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def as_text(self) -> dict[str, str]:
        content = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        # `developer` is OpenAI's newer name for a system message; providers know `system`.
        role = "system" if self.role == "developer" else self.role
        return {"role": role, "content": content}


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: bool = False


class ChatRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    messages: list[ClientMessage] = []
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, gt=0)
    max_completion_tokens: int | None = Field(default=None, gt=0)
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    stop: str | list[str] | None = None
    user: str | None = None
    n: int | None = Field(default=None, ge=1, le=1)
    # switchyard's own fields, sent by SDK clients through `extra_body`
    variables: dict[str, Any] = {}
    prompt_version: int | None = Field(default=None, gt=0)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens


def parse_chat_request(raw: bytes) -> ChatRequest:
    """Parse a request body; errors name the field and the rule, never the value sent."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(
            "invalid_json", f"request body is not valid JSON (at character {getattr(exc, 'pos', 0)})"
        ) from None
    if not isinstance(data, dict):
        raise BadRequest("invalid_json", "request body must be a JSON object")
    try:
        return ChatRequest.model_validate(data)
    except ValidationError as exc:
        # include_input=False: pydantic would otherwise echo `input_value`, i.e. request content.
        first = exc.errors(include_input=False, include_url=False, include_context=False)[0]
        loc = ".".join(str(x) for x in first["loc"])
        raise BadRequest("invalid_request", f"{loc}: {first['msg']}", param=loc) from None


def completion_body(
    request_id: str, model: str, text: str, finish_reason: str, usage: Usage, created: int | None = None
) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text, "refusal": None},
                "finish_reason": finish_reason,
                "logprobs": None,
            }
        ],
        "usage": usage_body(usage),
    }


def usage_body(usage: Usage) -> dict[str, Any]:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }


def chunk_body(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str | None = None,
    role: bool = False,
    finish_reason: str | None = None,
    usage: Usage | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    choices = (
        [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]
    )
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": choices,
    }
    if usage is not None:
        body["usage"] = usage_body(usage)
    return body


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
