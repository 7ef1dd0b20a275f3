"""Reading the gateway's OpenAI-format request, for adapters that speak another wire format.

The Anthropic and Bedrock adapters share these readers, so both accept and refuse the same
things in the same words. A refusal is `ProviderError(BAD_REQUEST)` naming the field
(`messages[2].content[0].image_url.url`, `tool_choice`) and never quoting request content.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from switchyard.gateway import json_text
from switchyard.gateway.messages import Message, joined_text
from switchyard.gateway.providers.base import OutputFormat, ProviderError
from switchyard.policy.models import ErrorClass

IMAGE_SUBTYPES = ("png", "jpeg", "gif", "webp")  # what both Anthropic and Bedrock take
_SUBTYPE_ALIASES = {"jpg": "jpeg"}


def cannot_honour(provider: str, field: str, why: str) -> ProviderError:
    return ProviderError(ErrorClass.BAD_REQUEST, f"{provider} cannot honour {field}: {why}")


@dataclass(frozen=True)
class FunctionTool:
    """One OpenAI function tool, read."""

    name: str
    description: str | None
    parameters: dict[str, Any]
    strict: bool | None


def function_tools(provider: str, tools: Sequence[dict[str, Any]]) -> list[FunctionTool]:
    return [_function_tool(provider, i, tool) for i, tool in enumerate(tools)]


def _function_tool(provider: str, i: int, tool: dict[str, Any]) -> FunctionTool:
    fn = tool.get("function")
    if tool.get("type") != "function" or not isinstance(fn, dict):
        raise cannot_honour(provider, f"tools[{i}]", "only function tools translate")
    name = fn.get("name")
    if not isinstance(name, str) or not name:
        raise cannot_honour(provider, f"tools[{i}].function.name", "a function tool needs a name")
    # OpenAI reads absent parameters as a function without arguments.
    parameters = fn.get("parameters") or {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise cannot_honour(provider, f"tools[{i}].function.parameters", "not a JSON schema object")
    description = fn.get("description") or None
    strict = fn.get("strict")
    return FunctionTool(name, description, parameters, strict if isinstance(strict, bool) else None)


ChoiceMode = Literal["auto", "none", "required", "named"]
_MODES: dict[str, ChoiceMode] = {"auto": "auto", "none": "none", "required": "required"}


@dataclass(frozen=True)
class ToolChoice:
    mode: ChoiceMode
    name: str | None = None  # the function, when `mode` is named


def tool_choice(provider: str, choice: str | dict[str, Any] | None) -> ToolChoice | None:
    if choice is None:
        return None
    if isinstance(choice, str) and choice in _MODES:
        return ToolChoice(_MODES[choice])
    if isinstance(choice, dict) and choice.get("type") == "function":
        name = (choice.get("function") or {}).get("name")
        if isinstance(name, str) and name:
            return ToolChoice("named", name)
    raise cannot_honour(provider, "tool_choice", "only auto, none, required or one named function translate")


def tool_arguments(provider: str, field: str, text: Any) -> dict[str, Any]:
    """A tool call's arguments JSON text as the object the other wire formats carry."""
    if not isinstance(text, str):
        raise cannot_honour(provider, field, "arguments must be a JSON text")
    if not text.strip():
        return {}  # some clients send "" for a call without arguments
    try:
        value = json_text.loads(text)
    except ValueError:
        raise cannot_honour(provider, field, "arguments are not valid JSON") from None
    if not isinstance(value, dict):
        raise cannot_honour(provider, field, "arguments must be a JSON object")
    return value


@dataclass(frozen=True)
class InlineImage:
    """An image carried in a `data:` URL."""

    subtype: str  # one of IMAGE_SUBTYPES
    base64_data: str

    @property
    def media_type(self) -> str:
        return f"image/{self.subtype}"

    def raw(self) -> bytes:
        return base64.b64decode(self.base64_data, validate=True)


def inline_image(provider: str, field: str, url: str) -> InlineImage:
    """`data:image/<png|jpeg|gif|webp>;base64,<data>`, checked (the data must decode)."""
    header, comma, data = url.partition(",")
    media, _, encoding = header.removeprefix("data:").partition(";")
    kind, _, subtype = media.lower().partition("/")
    subtype = _SUBTYPE_ALIASES.get(subtype, subtype)
    if not comma or encoding.lower() != "base64":
        raise cannot_honour(provider, field, "a data URL must be base64-encoded")
    if kind != "image" or subtype not in IMAGE_SUBTYPES:
        raise cannot_honour(provider, field, "the image must be png, jpeg, gif or webp")
    try:
        base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise cannot_honour(provider, field, "the data URL's base64 does not decode") from None
    return InlineImage(subtype, data)


def image_url(provider: str, field: str, part: dict[str, Any]) -> str:
    """The URL of an `image_url` part. Its `detail` is OpenAI's resolution hint, which
    neither other format has: the image is sent whole."""
    image = part.get("image_url")
    url = image.get("url") if isinstance(image, dict) else None
    if not isinstance(url, str) or not url:
        raise cannot_honour(provider, f"{field}.image_url.url", "an image part needs a URL")
    return url


def content_parts(
    provider: str, field: str, content: Any, allowed: tuple[str, ...]
) -> Iterator[tuple[str, dict[str, Any]]]:
    """(field name, part) for each part of `content` (a string is one text part); a part of a
    type not in `allowed` is refused, naming it."""
    if content is None:
        return
    if isinstance(content, str):
        yield field, {"type": "text", "text": content}
        return
    if not isinstance(content, list):
        raise cannot_honour(provider, field, "content must be a string or a list of parts")
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in allowed:
            raise cannot_honour(provider, f"{field}[{j}]", f"only {' and '.join(allowed)} parts translate here")
        yield f"{field}[{j}]", part


def text_only(provider: str, field: str, message: Message) -> str:
    """The message's text, refusing any part that is not text (system and tool messages)."""
    for _ in content_parts(provider, field, message.get("content"), ("text",)):
        pass
    return joined_text(message)


def turn_role(provider: str, i: int, message: Message) -> Literal["user", "assistant"] | None:
    """The turn a message belongs to in formats with user and assistant turns only: a tool
    result is the user's; None for a system message (those go to a top-level field)."""
    role = message.get("role")
    if role == "system":
        return None
    if role == "assistant":
        return "assistant"
    if role in ("user", "tool"):
        return "user"
    raise cannot_honour(provider, f"messages[{i}].role", "only system, user, assistant and tool translate")


@dataclass(frozen=True)
class PastToolCall:
    """A call in an assistant message of the history, its arguments parsed."""

    id: str
    name: str
    arguments: dict[str, Any]


def past_tool_calls(provider: str, i: int, message: Message) -> list[PastToolCall]:
    calls = []
    for k, call in enumerate(message.get("tool_calls") or ()):
        field = f"messages[{i}].tool_calls[{k}]"
        if not isinstance(call, dict):
            raise cannot_honour(provider, field, "a tool call must be an object")
        fn = call.get("function")
        if call.get("type", "function") != "function" or not isinstance(fn, dict):
            raise cannot_honour(provider, field, "only function calls translate")
        call_id, name = call.get("id"), fn.get("name")
        if not isinstance(call_id, str) or not call_id or not isinstance(name, str) or not name:
            raise cannot_honour(provider, field, "a tool call needs an id and a function name")
        calls.append(
            PastToolCall(call_id, name, tool_arguments(provider, f"{field}.function.arguments", fn.get("arguments")))
        )
    return calls


def tool_call_id(provider: str, i: int, message: Message) -> str:
    call_id = message.get("tool_call_id")
    if not isinstance(call_id, str) or not call_id:
        raise cannot_honour(provider, f"messages[{i}].tool_call_id", "a tool message needs the call's id")
    return call_id


def json_instruction(output: OutputFormat) -> str:
    """The system instruction for a provider asked for JSON in words, not natively; the
    gateway's output contract still checks the answer."""
    if output.schema is None:
        return "Answer with one JSON object and nothing else: no prose, no code fences."
    return (
        "Answer with one JSON value that matches this JSON schema, and nothing else: no prose, "
        "no code fences.\n" + json.dumps(output.schema, sort_keys=True)
    )


def wants_native_schema(output: OutputFormat | None) -> bool:
    return output is not None and output.native and output.schema is not None
