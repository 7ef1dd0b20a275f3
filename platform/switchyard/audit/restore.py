"""Restores reversible placeholders in an answer, including in a stream.

A placeholder (`<EMAIL_ADDRESS_1>`) can arrive split over chunks (`<EMAIL_AD` + `DRESS_1>`),
so the restorer holds back a tail that could still become one, and never more: text that
cannot be the start of a placeholder is released at once.
"""

from __future__ import annotations

import re

PLACEHOLDER = re.compile(r"<[A-Z][A-Z0-9_]*_\d+>")
_OPEN_TAIL = re.compile(r"<[A-Z0-9_]*\Z")


class PlaceholderRestorer:
    """Implements `switchyard.gateway.seams.StreamRestorer` for one answer."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self._mapping = mapping
        self._held = ""
        # A tail longer than the longest placeholder cannot become one: release it.
        self._max_tail = max((len(k) for k in mapping), default=0)

    def feed(self, chunk: str) -> str:
        if not self._mapping:
            return chunk
        text = self._held + chunk
        cut = len(text)
        tail = _OPEN_TAIL.search(text)
        if tail is not None and len(text) - tail.start() < self._max_tail:
            cut = tail.start()
        self._held = text[cut:]
        return self._substitute(text[:cut])

    def flush(self) -> str:
        text, self._held = self._held, ""
        return self._substitute(text)

    def restore(self, text: str) -> str:
        """Restore a whole (non-streamed) answer."""
        return self._substitute(text)

    def _substitute(self, text: str) -> str:
        # Unknown placeholders (a model's invention) pass through unchanged.
        return PLACEHOLDER.sub(lambda m: self._mapping.get(m.group(0), m.group(0)), text)
