"""Redaction of personal data in messages and answers: the gateway's `Redactor` seam.

Reversible mode replaces each distinct value with a numbered placeholder (`<EMAIL_ADDRESS_1>`)
and keeps the mapping in memory for the life of the request only, so the answer can be
restored; it is never stored. Irreversible mode replaces values with the bare entity type
(`<EMAIL_ADDRESS>`), which cannot be mapped back.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter, OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from presidio_anonymizer import AnonymizerEngine
from presidio_anonymizer.entities import OperatorConfig

from switchyard.audit.analysis_pool import AnalysisProcessPool
from switchyard.audit.data_policy import DataPolicySource, as_getter
from switchyard.audit.presidio_engine import ENTITIES, offline_analyzer
from switchyard.audit.restore import PlaceholderRestorer
from switchyard.gateway.messages import map_text
from switchyard.gateway.seams import Redacted, RedactionSummary

SCORE_THRESHOLD = 0.3  # phone numbers score 0.4 without context words; keep them


@dataclass
class _Numbering:
    """Value -> placeholder for one request, so a value repeated in two messages gets one name."""

    placeholders: dict[tuple[str, str], str] = field(default_factory=dict)
    per_type: Counter[str] = field(default_factory=Counter)

    def name(self, entity: str, value: str) -> str:
        key = (entity, value)
        if key not in self.placeholders:
            self.per_type[entity] += 1
            self.placeholders[key] = f"<{entity}_{self.per_type[entity]}>"
        return self.placeholders[key]

    def restore_map(self) -> dict[str, str]:
        return {ph: value for (_, value), ph in self.placeholders.items()}


class TextScrubber:
    """Find and replace personal data in text with Presidio (analyzer + anonymizer)."""

    def __init__(
        self,
        analyzer: Any | None = None,
        cache_size: int = 256,
        offload: AnalysisProcessPool | None = None,
        offload_chars: int = 16_384,
    ) -> None:
        """`offload`: where texts longer than `offload_chars` are analysed (another process,
        so a large text does not take the GIL from the gateway's event loop)."""
        self._analyzer = analyzer if analyzer is not None else offline_analyzer()
        self._offload = offload
        self._offload_chars = offload_chars
        self._anonymizer = AnonymizerEngine()
        self._recent: OrderedDict[bytes, list[Any]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_lock = threading.Lock()

    def scrub(
        self,
        text: str,
        mode: Literal["reversible", "irreversible"],
        numbering: _Numbering,
        counts: Counter[str],
    ) -> str:
        if not text:
            return text
        results = self._analyze(text)
        if not results:
            return text
        operators = {
            entity: OperatorConfig("custom", {"lambda": self._replacer(entity, mode, numbering)})
            for entity in {r.entity_type for r in results}
        }
        out = self._anonymizer.anonymize(text=text, analyzer_results=results, operators=operators)
        for item in out.items:
            counts[item.entity_type] += 1
        return str(out.text)

    def _analyze(self, text: str) -> list[Any]:
        """Presidio's findings, remembered briefly by the text's digest: the audit sink scrubs
        the same input the redactor analysed moments before, and analysis is the cost."""
        digest = hashlib.sha256(text.encode()).digest()
        with self._cache_lock:
            cached = self._recent.get(digest)
            if cached is not None:
                self._recent.move_to_end(digest)
                return cached
        results: list[Any]
        if self._offload is not None and len(text) > self._offload_chars:
            results = self._offload.analyze(text, ENTITIES, SCORE_THRESHOLD)
        else:
            results = self._analyzer.analyze(
                text=text, language="en", entities=list(ENTITIES), score_threshold=SCORE_THRESHOLD
            )
        with self._cache_lock:
            self._recent[digest] = results
            if len(self._recent) > self._cache_size:
                self._recent.popitem(last=False)
        return results

    @staticmethod
    def _replacer(
        entity: str, mode: Literal["reversible", "irreversible"], numbering: _Numbering
    ) -> Callable[[str], str]:
        if mode == "irreversible":
            return lambda _value: f"<{entity}>"
        return lambda value: numbering.name(entity, value)

    def scrub_text(self, text: str) -> tuple[str, dict[str, int]]:
        """Irreversibly redact one text (stored bodies); returns the text and entity counts."""
        counts: Counter[str] = Counter()
        return self.scrub(text, "irreversible", _Numbering(), counts), dict(counts)


class PresidioRedactor:
    """Implements `switchyard.gateway.seams.Redactor` from the data policies."""

    def __init__(self, policies: DataPolicySource, scrubber: TextScrubber | None = None) -> None:
        self._policies = as_getter(policies)
        self.scrubber = scrubber if scrubber is not None else TextScrubber()

    def redact(self, messages: list[dict[str, Any]], data_class: str) -> Redacted:
        cls = self._policies().classes.get(data_class)
        if cls is None:
            raise KeyError(
                f"data class {data_class!r} is not defined in data_policies.yaml "
                f"(defined: {', '.join(sorted(self._policies().classes))})"
            )
        if cls.send == "raw":
            return Redacted(messages=messages, summary=RedactionSummary(mode="none"))
        mode: Literal["reversible", "irreversible"] = "reversible" if cls.reversible else "irreversible"
        numbering, counts = _Numbering(), Counter[str]()
        # Every text a model reads: content, text parts, tool-call arguments and tool results.
        out = [map_text(m, lambda text: self.scrubber.scrub(text, mode, numbering, counts)) for m in messages]
        restore = numbering.restore_map() if mode == "reversible" else {}
        return Redacted(out, RedactionSummary(mode=mode, entity_counts=dict(counts)), restore)

    def restorer(self, redacted: Redacted) -> PlaceholderRestorer:
        return PlaceholderRestorer(redacted.restore)
