"""Reading a provider's answer field by field, so an answer that is JSON but not the wire
format fails as the provider's malformed answer and is never taken for something it is not.

An upstream (a provider, a proxy in front of one, a self-hosted server) can send a 200 whose
fields are missing or of another type. What each reader promises:
- the text and finish reason the client gets are strings, the finish reason in OpenAI's
  vocabulary; anything else makes the answer malformed (`Malformed`);
- a usage is read only when its counts are whole, non-negative and at most
  `MAX_CONTEXT_TOKENS` (so any call's cost fits the ledger's 64-bit columns); otherwise it is
  not read (`None`), and the answer is billed at the documented bound, as one without usage;
- the model id a provider reports is kept only when it can go in a header as it is.

The adapters catch `MALFORMED` around their readers and raise `malformed(...)`: a 200 is an
answer the provider may bill, however broken, so it is billed (at the bound) and falls back.
"""

from __future__ import annotations

import math
from typing import Any

from switchyard.gateway.providers.base import ProviderError
from switchyard.gateway.seams import Usage
from switchyard.policy.models import MAX_CONTEXT_TOKENS, ErrorClass

FINISH_REASONS = frozenset({"stop", "length", "tool_calls", "content_filter"})
MAX_MODEL_ID = 200  # longer than any provider's model ids; a header value, so bounded


def chat_answer_bytes(max_tokens: int) -> int:
    """The most an answer of `max_tokens` may take on the wire: 1 KiB a token (a stream sends
    about one token per event of ~200 bytes) and 1 MiB besides. More is an upstream that does
    not stop, and it must not fill the replica's memory."""
    return 2**20 + 2**10 * max_tokens


def embeddings_answer_bytes(inputs: int) -> int:
    """256 KiB a vector (a 3,072-dimension vector is about 70 KB of JSON) and 1 MiB besides."""
    return 2**20 + 2**18 * inputs


class Malformed(ValueError):
    """A field of the answer is missing or not what the wire format says."""


# What reading a damaged answer can raise: the readers' own, and a subscript of the wrong type.
MALFORMED = (Malformed, KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError)


class ErrorEvent(ProviderError):
    """The provider's stream reported an error (an `error` event): a failure it answered,
    not an answer it bills. Any other way a stream that began with 200 ends early is billed."""

    def __init__(self, provider: str) -> None:
        super().__init__(ErrorClass.SERVER_ERROR, f"{provider} reported an error mid-stream")


def malformed(provider: str, what: str = "response") -> ProviderError:
    return ProviderError(ErrorClass.SERVER_ERROR, f"{provider} returned a malformed {what}", billed=True)


def obj(value: Any, field: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise Malformed(f"{field} is not an object")
    return value


def array(value: Any, field: str) -> list[Any]:
    if not isinstance(value, list):
        raise Malformed(f"{field} is not an array")
    return value


def text(value: Any, field: str) -> str:
    """A text field; absent (None) is empty."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Malformed(f"{field} is not a string")
    return value


# What other OpenAI-compatible servers call the same ends (Hugging Face TGI: `eos_token`,
# `stop_sequence`). vLLM's `abort` is not here: that answer was cut short, so it is malformed.
FINISH_ALIASES = {"eos_token": "stop", "stop_sequence": "stop", "end_turn": "stop", "max_tokens": "length"}


def finish_reason(value: Any) -> str:
    """OpenAI's finish reason; absent is `stop`, as the adapters always read it."""
    if value is None:
        return "stop"
    if not isinstance(value, str) or FINISH_ALIASES.get(value, value) not in FINISH_REASONS:
        raise Malformed("finish_reason is not one of OpenAI's")
    return FINISH_ALIASES.get(value, value)


def mapped_finish(value: Any, finish_of: dict[str, str], field: str) -> str:
    """OpenAI's finish reason for another API's stop reason (`finish_of`); absent is `stop`,
    and a reason added to that API later reads as `stop` too."""
    if value is None:
        return "stop"
    if not isinstance(value, str):
        raise Malformed(f"{field} is not a string")
    return finish_of.get(value, "stop")


def token_count(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_CONTEXT_TOKENS:
        return value
    return None


def optional_count(value: Any) -> int | None:
    """A count the API may leave out (absent or null: 0)."""
    return 0 if value is None else token_count(value)


def usage(prompt: Any, completion: Any, cached: Any = None) -> Usage | None:
    """The usage these counts state, or None when any is not a count (`cached` may be absent)."""
    p, c, k = token_count(prompt), token_count(completion), optional_count(cached)
    if p is None or c is None or k is None:
        return None
    return Usage(p, c, min(k, p))


def uncached_usage(fresh: Any, completion: Any, read: Any, written: Any) -> Usage | None:
    """The usage of an API whose input count leaves out the tokens read from and written to the
    prompt cache (Anthropic, Bedrock): the prompt is all three; cache writes are counted at the
    input price."""
    f, r, w = token_count(fresh), optional_count(read), optional_count(written)
    if f is None or r is None or w is None:
        return None
    return usage(f + r + w, completion, r)


def index(value: Any, field: str) -> int:
    """A position in a list the answer builds (a small whole number, as a count is)."""
    found = token_count(value)
    if found is None:
        raise Malformed(f"{field} is not a whole number")
    return found


def vector_component(value: Any) -> float:
    """A finite number: JSON readers take `NaN` and `Infinity`, which no answer can carry on."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise Malformed("a vector component is not a finite number")
    return float(value)


def model_id(value: Any, asked: str) -> str:
    """The model id the provider says answered, when it is one; else the one asked for."""
    if isinstance(value, str) and 0 < len(value) <= MAX_MODEL_ID and value.isprintable() and value.isascii():
        return value
    return asked
