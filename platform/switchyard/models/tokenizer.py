"""A byte-level tokenizer: every UTF-8 byte is a token, plus one end-of-text id.

No vocabulary file and no download, so any text trains and any id sequence decodes.
"""

from __future__ import annotations

from collections.abc import Iterable


class ByteTokenizer:
    """Token ids 0..255 are bytes; `eot_id` (256) separates documents."""

    vocab_size = 257
    eot_id = 256

    def encode(self, text: str, *, add_eot: bool = False) -> list[int]:
        ids = list(text.encode("utf-8"))
        if add_eot:
            ids.append(self.eot_id)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Bytes to text; end-of-text ids are dropped and invalid UTF-8 is replaced, not raised,
        because sampled sequences can end mid-character."""
        data = bytes(i for i in ids if 0 <= i < 256)
        return data.decode("utf-8", errors="replace")
