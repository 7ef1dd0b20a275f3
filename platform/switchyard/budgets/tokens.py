"""Input-token counts for cost estimates, per tokenizer family (`family` in providers.yaml).

No real BPE tokenizer is usable here: tiktoken downloads its encodings at run time, and the
platform runs without network access. So every BPE family uses a documented approximation
that errs high, because an estimate that is too low lets a request reserve less than it
may spend:

- `bytes` (switchyard's own model): exact, one token per UTF-8 byte, plus the bytes of the
  role name and three formatting bytes per message (`role: content\n`).
- `o200k`, `cl100k`, `claude`: one token per 3 UTF-8 bytes, rounded up, per message. English
  prose averages ~4 bytes per token with these vocabularies, so this overestimates by ~25%.
- anything else (`generic`): one token per 2 bytes.
- every BPE family adds OpenAI's documented chat framing: 4 tokens per message and 3 to
  prime the reply.

Output tokens of an answer whose provider reported no usage (`output_tokens_upper_bound`)
must be a bound, not an average: that count is what the request is charged. It is the UTF-8
byte count of the text plus `OUTPUT_SPECIAL_TOKENS`, whatever the family. Why that bounds them:
- `bytes`: one token per byte, plus the end-of-text token: exact.
- `o200k`, `cl100k`, `claude` are byte-level BPEs: every token stands for one or more bytes of
  text, so n bytes are at most n tokens; the worst case is the byte tokenizer's count.
- `generic` (SentencePiece-like, with byte fallback): a character is at most its bytes'
  tokens, plus one leading word-boundary marker.
- `OUTPUT_SPECIAL_TOKENS` covers end-of-turn or stop tokens some providers bill as output and
  that marker.
Never more than `max_output_tokens` (the provider stops there), and exactly that for a stream
cut before it finished: the provider may have billed tokens the gateway never received. For
English the bound is ~4x the real count; it is charged only where usage is missing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BYTES_PER_TOKEN: dict[str, float] = {"o200k": 3.0, "cl100k": 3.0, "claude": 3.0}
GENERIC_BYTES_PER_TOKEN = 2.0
MESSAGE_FRAMING_TOKENS = 4
REPLY_PRIMING_TOKENS = 3
OUTPUT_SPECIAL_TOKENS = 2


def count_input_tokens(family: str, messages: Sequence[dict[str, str]]) -> int:
    if family == "bytes":
        return sum(len(m.get("content", "").encode()) + len(m.get("role", "").encode()) + 3 for m in messages)
    ratio = BYTES_PER_TOKEN.get(family, GENERIC_BYTES_PER_TOKEN)
    body = sum(math.ceil(len(m.get("content", "").encode()) / ratio) for m in messages)
    return body + MESSAGE_FRAMING_TOKENS * len(messages) + REPLY_PRIMING_TOKENS


def output_tokens_upper_bound(text: str, max_output_tokens: int, *, finished: bool) -> int:
    """At least the output tokens a provider billed for `text`, in every tokenizer family
    (see the module docstring).

    `text` is what the provider sent, before any redaction placeholder was restored;
    `finished`: the provider ended the answer itself (a finish reason), so `text` is all of it."""
    if not finished:
        return max_output_tokens
    return min(len(text.encode()) + OUTPUT_SPECIAL_TOKENS, max_output_tokens)
