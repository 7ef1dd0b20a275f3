"""The OpenAI chat-completions wire format as the gateway accepts and answers it.

Only the fields the gateway can honour are accepted; unknown fields are a 400 naming the
field (a silently ignored `tools` would be a worse surprise). Prompt variables and an
optional prompt version travel in `extra_body` (`variables`, `prompt_version`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from switchyard.gateway.errors import BadRequest, json_path
from switchyard.gateway.seams import Usage
from switchyard.policy.models import RequestLimits


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


def parse_chat_request(raw: bytes, limits: RequestLimits | None = None) -> ChatRequest:
    """Parse a request body; errors name the field's JSON path and the rule, never the value sent."""
    limits = limits or RequestLimits()
    data = _decode_json(raw)
    if not isinstance(data, dict):
        raise BadRequest("invalid_json", "request body must be a JSON object")
    try:
        request = ChatRequest.model_validate(data)
    except ValidationError as exc:
        # include_input=False: pydantic would otherwise echo `input_value`, i.e. request content.
        first = exc.errors(include_input=False, include_url=False, include_context=False)[0]
        path = json_path(_field_loc(first["loc"]))
        raise BadRequest("invalid_request", f"{path}: {first['msg']}", param=path) from None
    if len(request.messages) > limits.max_messages:
        raise BadRequest(
            "too_many_messages",
            f"messages: at most {limits.max_messages} messages per request, got {len(request.messages)}",
            param="messages",
        )
    too_deep = _deeper_than(request.variables, limits.max_json_depth, ("variables",))
    if too_deep is not None:
        path = json_path(too_deep[:2])  # the variable, not the 30-odd levels below it
        raise BadRequest("too_deeply_nested", f"{path}: nested deeper than {limits.max_json_depth} levels", param=path)
    return request


_LONE_SURROGATE_CANDIDATE = re.compile(rb"\\u[dD][89a-fA-F]")


def _decode_json(raw: bytes) -> Any:
    try:
        data = json.loads(raw, parse_constant=_no_constants)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(
            "invalid_json", f"request body is not valid JSON (at character {getattr(exc, 'pos', 0)})"
        ) from None
    except RecursionError:
        raise BadRequest("invalid_json", "request body is nested too deeply") from None
    except ValueError as exc:  # NaN/Infinity, or an integer past Python's 4,300-digit limit
        raise BadRequest("invalid_json", f"request body has an unacceptable number ({exc.args[0][:60]})") from None
    # JSON may escape half of a UTF-16 surrogate pair (`"\\ud800"`); such a string cannot be
    # encoded, sent or stored. The byte search keeps the walk off the common path.
    if _LONE_SURROGATE_CANDIDATE.search(raw):
        bad = _unencodable(data, ())
        if bad is not None:
            path = json_path(bad)
            raise BadRequest("invalid_string", f"{path}: contains a lone UTF-16 surrogate", param=path)
    return data


def _no_constants(name: str) -> None:
    raise ValueError(f"{name} is not a JSON number")


def _unencodable(value: Any, loc: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The location of the first string (key or value) that is not valid Unicode text."""
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, loc)]
    while stack:
        item, at = stack.pop()
        if isinstance(item, str):
            try:
                item.encode()
            except UnicodeEncodeError:
                return at
        elif isinstance(item, dict):
            for k, v in item.items():
                try:
                    k.encode()
                except UnicodeEncodeError:
                    return at
                stack.append((v, (*at, k)))
        elif isinstance(item, list):
            stack.extend((v, (*at, i)) for i, v in enumerate(item))
    return None


def _deeper_than(value: Any, limit: int, loc: tuple[str | int, ...]) -> tuple[str | int, ...] | None:
    """The location of a container nested more than `limit` levels below `value`, if any."""
    stack: list[tuple[Any, tuple[str | int, ...], int]] = [(value, loc, 0)]
    while stack:
        item, at, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > limit:
                return at
            pairs = item.items() if isinstance(item, dict) else enumerate(item)
            stack.extend((v, (*at, k), depth + 1) for k, v in pairs)
    return None


def _field_loc(loc: tuple[str | int, ...]) -> tuple[str | int, ...]:
    """Drop pydantic's union-member tags (`str`, `list[TextPart]`) from an error location."""
    return tuple(p for p in loc if isinstance(p, int) or not (p in _TYPE_TAGS or "[" in p))


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


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
