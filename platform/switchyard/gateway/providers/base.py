"""The provider interface: one call in, a completion or a stream of deltas out, typed errors.

Every adapter maps its failures onto `ErrorClass` so fallback rules can name them, and puts
no request content or credential into an error message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass


@dataclass(frozen=True)
class OutputFormat:
    """The JSON the answer must be: `schema` None means any JSON object (`json_object`).

    `native`: the provider is asked for it in its own terms (OpenAI's `response_format`);
    otherwise the answer is checked by the output contract, repaired once, then falls back."""

    schema: dict[str, Any] | None = None
    name: str = "answer"
    strict: bool = False
    native: bool = False


@dataclass(frozen=True)
class ProviderCall:
    """What one attempt sends: already rendered and redacted messages, and its time budget.

    `messages` are in OpenAI's chat format (see `switchyard.gateway.messages`): content a
    string or a list of `text` / `image_url` parts, assistant `tool_calls`, `tool` results.
    Each adapter translates them, and every field here, or refuses what it cannot honour."""

    model: str  # catalog name
    model_version: str  # the id the provider knows
    messages: list[dict[str, Any]]
    max_tokens: int
    timeout_s: float
    request_id: str
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    output: OutputFormat | None = None  # the answer must be JSON (a flow's schema or the request's)
    tools: tuple[dict[str, Any], ...] = ()  # OpenAI function tools: {"type": "function", "function": {...}}
    tool_choice: str | dict[str, Any] | None = None  # "auto" | "none" | "required" | {"type": "function", ...}
    parallel_tool_calls: bool | None = None

    @property
    def json_output(self) -> bool:
        return self.output is not None


@dataclass(frozen=True)
class ToolCall:
    """A function call the model asks the client to run; `arguments` is a JSON text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Completion:
    text: str
    usage: Usage
    finish_reason: str  # OpenAI's vocabulary: stop, length, content_filter, tool_calls
    model_version: str
    usage_reported: bool = True  # False: the provider sent no usage; it is billed at the bound
    tool_calls: tuple[ToolCall, ...] = ()


@dataclass(frozen=True)
class ToolCallDelta:
    """A piece of a streamed tool call, in OpenAI's chunk shape: the first piece of call
    `index` carries its `id` and `name`, later pieces carry `arguments` fragments."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True)
class Delta:
    """One piece of a streamed answer; the last one carries the finish reason and usage."""

    text: str = ""
    finish_reason: str | None = None
    usage: Usage | None = None
    tool_calls: tuple[ToolCallDelta, ...] = ()


class ProviderError(Exception):
    """An attempt failed. `message` is safe to show: no request content, no credentials."""

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        status: int | None = None,
        retry_after_s: float | None = None,
        billed: bool = False,
    ) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message
        self.status = status
        self.retry_after_s = retry_after_s
        self.billed = billed  # the provider answered (so may have billed) but its answer is unusable


class ProviderOverloaded(ProviderError):
    """An in-cluster model's request queue is full (Serve's `max_queued_requests`): the
    provider is healthy but busy. It falls back like `rate_limited`, is not retried on the same
    candidate (that would only add load) and does not count against the circuit; when nothing
    else answers, the client gets 503 `overloaded` with Retry-After."""

    def __init__(self, message: str, *, queued: int, max_queued: int, retry_after_s: float | None = None) -> None:
        super().__init__(ErrorClass.RATE_LIMITED, message, status=503, retry_after_s=retry_after_s)
        self.queued = queued
        self.max_queued = max_queued


class ChatProvider(Protocol):
    """One upstream. Implementations pool their connections and are safe to share."""

    name: str

    async def complete(self, call: ProviderCall) -> Completion: ...

    def stream(self, call: ProviderCall) -> AsyncIterator[Delta]: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class EmbeddingCall:
    """One embeddings attempt: already redacted input texts, in order."""

    model: str  # catalog name
    model_version: str
    inputs: tuple[str, ...]
    timeout_s: float
    request_id: str
    dimensions: int | None = None


@dataclass(frozen=True)
class Embeddings:
    vectors: tuple[tuple[float, ...], ...]  # one per input, in input order
    prompt_tokens: int
    model_version: str
    usage_reported: bool = True


class EmbeddingProvider(Protocol):
    """An upstream that embeds text (OpenAI-compatible `/embeddings`, Bedrock, in-cluster)."""

    name: str

    async def embed(self, call: EmbeddingCall) -> Embeddings: ...


def classify_status(status: int, detail: str) -> ErrorClass:
    """Map an upstream HTTP status (and its error text) to the error class fallback rules use."""
    lowered = detail.lower()
    if status < 400:
        # Not the answer (200) nor an error: a redirect (never followed) or another success is
        # an upstream not speaking the API at that address, the platform's fault, not the client's.
        return ErrorClass.SERVER_ERROR
    if status == 429:
        return ErrorClass.RATE_LIMITED
    if status in (408, 504):
        return ErrorClass.TIMEOUT
    if status >= 500:
        return ErrorClass.SERVER_ERROR
    if "context_length" in lowered or "context length" in lowered or "too long" in lowered:
        return ErrorClass.CONTEXT_LENGTH
    if "content_filter" in lowered or "content_policy" in lowered or "content filter" in lowered:
        return ErrorClass.CONTENT_FILTER
    if status in (401, 403, 404):
        # Our credentials or our catalog are wrong, not the client's request: a platform fault.
        return ErrorClass.SERVER_ERROR
    return ErrorClass.BAD_REQUEST


MAX_RETRY_AFTER_S = 86_400.0  # a day: a provider asking for longer is not stating a delay


def retry_after_seconds(value: str | None) -> float | None:
    """An upstream's `Retry-After` as seconds, when it states a delay (0 to a day); None for
    anything else (`inf`, `nan`, a negative or a larger number, an HTTP-date: providers we speak
    to send seconds), which falls back to the gateway's own backoff and is not passed on."""
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if 0.0 <= seconds <= MAX_RETRY_AFTER_S else None  # False for nan
