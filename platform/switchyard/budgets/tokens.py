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
"""

from __future__ import annotations

import math
from collections.abc import Sequence

BYTES_PER_TOKEN: dict[str, float] = {"o200k": 3.0, "cl100k": 3.0, "claude": 3.0}
GENERIC_BYTES_PER_TOKEN = 2.0
MESSAGE_FRAMING_TOKENS = 4
REPLY_PRIMING_TOKENS = 3


def count_input_tokens(family: str, messages: Sequence[dict[str, str]]) -> int:
    if family == "bytes":
        return sum(len(m.get("content", "").encode()) + len(m.get("role", "").encode()) + 3 for m in messages)
    ratio = BYTES_PER_TOKEN.get(family, GENERIC_BYTES_PER_TOKEN)
    body = sum(math.ceil(len(m.get("content", "").encode()) / ratio) for m in messages)
    return body + MESSAGE_FRAMING_TOKENS * len(messages) + REPLY_PRIMING_TOKENS
