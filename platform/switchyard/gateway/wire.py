"""The OpenAI chat-completions wire format as the gateway accepts and answers it.

Only the fields the gateway can honour are accepted; unknown fields are a 400 naming the
field (a silently ignored `tools` would be a worse surprise). Prompt variables and an
optional prompt version travel in `extra_body` (`variables`, `prompt_version`).
"""

from __future__ import annotations

import json
import re
import time
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from switchyard.gateway.errors import BadRequest, json_path
from switchyard.gateway.messages import Message
from switchyard.gateway.providers.base import ToolCall, ToolCallDelta
from switchyard.gateway.seams import Usage
from switchyard.policy.models import RequestLimits

TOOL_NAME = r"^[a-zA-Z0-9_-]{1,64}$"  # OpenAI's rule, which Anthropic's and Bedrock's admit too
_IMAGE_DATA_URL = re.compile(r"^data:image/(png|jpeg|gif|webp);base64,[A-Za-z0-9+/=\s]+$")


class TextPart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text"]
    text: str


class ImageURL(BaseModel):
    model_config = ConfigDict(extra="forbid")
    url: str = Field(min_length=1)
    detail: Literal["auto", "low", "high"] = "auto"

    @field_validator("url")
    @classmethod
    def _https_or_data(cls, v: str) -> str:
        if v.startswith("data:"):
            if not _IMAGE_DATA_URL.match(v):
                raise ValueError("a data URL must be base64 image/png, image/jpeg, image/gif or image/webp")
        elif not v.startswith("https://"):
            raise ValueError("an image URL must be https:// or a base64 data: URL")
        return v


class ImagePart(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["image_url"]
    image_url: ImageURL


ContentPart = Annotated[TextPart | ImagePart, Field(discriminator="type")]


class FunctionCall(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=TOOL_NAME)
    arguments: str  # a JSON text, as the model wrote it


class ToolCallIn(BaseModel):
    """A tool call of an earlier assistant turn, sent back as conversation history."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1, max_length=256)
    type: Literal["function"] = "function"
    function: FunctionCall


class ClientMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None  # assistant turns only
    tool_call_id: str | None = Field(default=None, min_length=1, max_length=256)  # tool turns only
    # What the SDK echoes back when a client appends the answer's message object to the
    # history: the assistant's own words, kept as history only.
    refusal: str | None = None
    annotations: list[Any] | None = None
    audio: None = None
    function_call: None = None  # the deprecated `functions` API: use `tools`

    @model_validator(mode="after")
    def _shape_of_role(self) -> ClientMessage:
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role == "tool":
            if self.tool_call_id is None:
                raise ValueError("a tool message needs tool_call_id (the call it answers)")
            if isinstance(self.content, list) and any(isinstance(p, ImagePart) for p in self.content):
                raise ValueError("a tool message's content is text")
        elif self.tool_call_id is not None:
            raise ValueError("only tool messages carry tool_call_id")
        if self.content is None and not (self.role == "assistant" and self.tool_calls):
            raise ValueError("content is required (it may be null only on an assistant turn that calls tools)")
        has_image = isinstance(self.content, list) and any(isinstance(p, ImagePart) for p in self.content)
        if has_image and self.role in ("system", "developer", "assistant"):
            raise ValueError(f"images go in user messages, not {self.role} messages")
        return self

    def as_message(self) -> Message:
        """The gateway's message shape (OpenAI's, normalised; see `gateway.messages`)."""
        # `developer` is OpenAI's newer name for a system message; providers know `system`.
        role = "system" if self.role == "developer" else self.role
        content: Any = self.content
        if isinstance(content, list):
            if all(isinstance(p, TextPart) for p in content):
                content = "".join(p.text for p in content if isinstance(p, TextPart))
            else:
                content = [p.model_dump() for p in content]
        out: Message = {"role": role, "content": content}
        if self.tool_calls:
            out["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


class FunctionDef(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema
    strict: bool | None = None


class Tool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=TOOL_NAME)


class NamedToolChoice(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["function"]
    function: NamedFunction


class JSONSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(pattern=TOOL_NAME)
    description: str | None = None
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_type(self) -> ResponseFormat:
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given exactly when type is json_schema")
        return self


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
    tools: list[Tool] | None = Field(default=None, max_length=128)
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # switchyard's own fields, sent by SDK clients through `extra_body`
    variables: dict[str, Any] = {}
    prompt_version: int | None = Field(default=None, gt=0)

    @field_validator("stop")
    @classmethod
    def _stop_list(cls, v: str | list[str] | None) -> str | list[str] | None:
        if isinstance(v, list) and len(v) > 4:
            raise ValueError("at most 4 stop sequences")
        return v

    @field_validator("tools")
    @classmethod
    def _unique_tool_names(cls, v: list[Tool] | None) -> list[Tool] | None:
        names = [t.function.name for t in v or ()]
        if len(set(names)) != len(names):
            raise ValueError("two tools share a name")
        return v

    @field_validator("tool_choice")
    @classmethod
    def _choice_among_tools(cls, v: Any, info: ValidationInfo) -> Any:
        names = {t.function.name for t in info.data.get("tools") or ()}
        if isinstance(v, NamedToolChoice) and v.function.name not in names:
            raise ValueError("names a function that is not in tools")
        if v == "required" and not names:
            raise ValueError("is required but no tools are given")
        return v

    def stop_sequences(self) -> list[str]:
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens or self.max_tokens

    def tool_dicts(self) -> tuple[dict[str, Any], ...]:
        return tuple(t.model_dump(exclude_none=True) for t in self.tools or ())

    def tool_choice_value(self) -> str | dict[str, Any] | None:
        if isinstance(self.tool_choice, NamedToolChoice):
            return self.tool_choice.model_dump()
        return self.tool_choice


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
        errors = exc.errors(include_input=False, include_url=False, include_context=False)
        # A value that fits no member of a union fails each member; the deepest error is the
        # one that says what is wrong (an image part's URL, not "content should be a string").
        first = max(errors, key=lambda e: len(_field_loc(e["loc"])))
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
    """Drop pydantic's union-member tags (`str`, `list[TextPart]`, and a tagged union's tag,
    which repeats the field it selects: `image_url.image_url`) from an error location."""
    kept = [p for p in loc if isinstance(p, int) or not (p in _TYPE_TAGS or "[" in p)]
    return tuple(p for i, p in enumerate(kept) if i == 0 or isinstance(p, int) or p != kept[i - 1])


_TYPE_TAGS = frozenset({"str", "int", "float", "bool", "dict", "list", "none"})


def completion_body(
    request_id: str,
    model: str,
    text: str,
    finish_reason: str,
    usage: Usage,
    created: int | None = None,
    tool_calls: tuple[ToolCall, ...] = (),
    switchyard: dict[str, Any] | None = None,
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text or None if tool_calls else text, "refusal": None}
    if tool_calls:
        message["tool_calls"] = [tool_call_body(c) for c in tool_calls]
    body: dict[str, Any] = {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": created if created is not None else int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason, "logprobs": None}],
        "usage": usage_body(usage, switchyard),
    }
    return body


def tool_call_body(call: ToolCall) -> dict[str, Any]:
    return {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}


def usage_body(usage: Usage, switchyard: dict[str, Any] | None = None) -> dict[str, Any]:
    """OpenAI's usage object; `switchyard` adds the request's cost and budget left (streams
    carry them here because their headers leave before the cost is known)."""
    body: dict[str, Any] = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.prompt_tokens + usage.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_prompt_tokens},
    }
    if switchyard is not None:
        body["switchyard"] = switchyard
    return body


def chunk_body(
    request_id: str,
    model: str,
    created: int,
    *,
    text: str | None = None,
    role: bool = False,
    finish_reason: str | None = None,
    usage: Usage | None = None,
    tool_calls: tuple[ToolCallDelta, ...] = (),
    switchyard: dict[str, Any] | None = None,
) -> dict[str, Any]:
    delta: dict[str, Any] = {}
    if role:
        delta["role"] = "assistant"
    if text is not None:
        delta["content"] = text
    if tool_calls:
        delta["tool_calls"] = [_tool_call_delta(d) for d in tool_calls]
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
        body["usage"] = usage_body(usage, switchyard)
    return body


def _tool_call_delta(d: ToolCallDelta) -> dict[str, Any]:
    """OpenAI's chunk shape: the first piece of a call names it, later ones add arguments."""
    out: dict[str, Any] = {"index": d.index}
    fn: dict[str, Any] = {"arguments": d.arguments}
    if d.id is not None:
        out["id"], out["type"] = d.id, "function"
    if d.name is not None:
        fn["name"] = d.name
    out["function"] = fn
    return out


def sse(data: dict[str, Any] | str) -> bytes:
    payload = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {payload}\n\n".encode()
