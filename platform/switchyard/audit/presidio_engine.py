"""An offline Presidio analyzer: pattern and checksum recognizers over a blank spaCy pipeline.

Presidio's default engine loads (and if missing, downloads) `en_core_web_lg`; this one loads
nothing from disk or network. Names and addresses (NER entities) are therefore not detected:
only values with a recognisable shape (see `ENTITIES`).
"""

from __future__ import annotations

from typing import Any

import spacy
import tldextract
from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
from presidio_analyzer.nlp_engine import SpacyNlpEngine
from presidio_analyzer.predefined_recognizers import (
    CreditCardRecognizer,
    EmailRecognizer,
    IbanRecognizer,
    IpRecognizer,
    PhoneRecognizer,
    UkNinoRecognizer,
    UsSsnRecognizer,
)

ENTITIES = (
    "EMAIL_ADDRESS",
    "PHONE_NUMBER",
    "CREDIT_CARD",
    "IBAN_CODE",
    "US_SSN",
    "IP_ADDRESS",
    "UK_NINO",
)


class _BlankSpacyEngine(SpacyNlpEngine):  # type: ignore[misc]
    """Tokenisation only: `spacy.blank("en")` ships with spaCy and needs no model package."""

    def __init__(self) -> None:
        super().__init__(models=[{"lang_code": "en", "model_name": "blank:en"}])

    def load(self) -> None:
        self.nlp = {"en": spacy.blank("en")}


class _OfflineEmailRecognizer(EmailRecognizer):  # type: ignore[misc]
    """Presidio's email check calls `tldextract.extract`, whose default extractor fetches the
    public-suffix list over HTTP; this one uses the snapshot bundled with tldextract."""

    def __init__(self) -> None:
        super().__init__()
        self._tld = tldextract.TLDExtract(suffix_list_urls=(), cache_dir=None)

    def validate_result(self, pattern_text: str) -> bool:
        return bool(self._tld(pattern_text).fqdn)


# Regions whose national (no +country) phone formats are recognised; numbers written with a
# +country prefix are found whatever the region. Each region is one more full pass of
# `phonenumbers`' matcher, which is most of the analysis time (Presidio's default is 8, two of
# them not region codes at all), so the list is short; add a team's countries here.
PHONE_REGIONS = ("US", "GB", "DE", "FR")


def offline_analyzer(phone_regions: tuple[str, ...] = PHONE_REGIONS) -> Any:
    """Build the analyzer (about 0.2 s; build once per process and share it)."""
    registry = RecognizerRegistry(supported_languages=["en"])
    for recognizer in (
        _OfflineEmailRecognizer(),
        PhoneRecognizer(supported_regions=phone_regions),
        CreditCardRecognizer(),  # Luhn-checked
        IbanRecognizer(),  # mod-97-checked
        UsSsnRecognizer(),
        IpRecognizer(),
        UkNinoRecognizer(),
    ):
        registry.add_recognizer(recognizer)
    engine = _BlankSpacyEngine()
    engine.load()
    return AnalyzerEngine(registry=registry, nlp_engine=engine, supported_languages=["en"])
