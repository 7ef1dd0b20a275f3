"""Redaction with Presidio, offline: detection, reversible and irreversible modes, restoring."""

from __future__ import annotations

import itertools
import socket
from typing import Any

import pytest
from _audit_helpers import CARD, EMAIL, IBAN, PERSONAL_TEXT, PHONE, RAW_VALUES, SSN
from hypothesis import given, settings
from hypothesis import strategies as st

from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.restore import PlaceholderRestorer
from switchyard.policy.models import DataPolicies
from tests.examples import examples


def test_detects_each_entity_type(scrubber: TextScrubber) -> None:
    text, counts = scrubber.scrub_text(PERSONAL_TEXT + " From 10.1.2.3.")
    for value in RAW_VALUES:
        assert value not in text
    assert counts == {
        "EMAIL_ADDRESS": 1,
        "PHONE_NUMBER": 1,
        "CREDIT_CARD": 1,
        "IBAN_CODE": 1,
        "US_SSN": 1,
        "IP_ADDRESS": 1,
    }
    assert "<CREDIT_CARD>" in text and "Hi, I'm Jane" in text


def test_card_number_failing_luhn_is_left_alone(scrubber: TextScrubber) -> None:
    text, counts = scrubber.scrub_text("order 4111 1111 1111 1112 shipped")
    assert "CREDIT_CARD" not in counts and "4111 1111 1111 1112" in text


def test_personal_class_sends_reversible_placeholders(data_policies: DataPolicies, scrubber: TextScrubber) -> None:
    redactor = PresidioRedactor(data_policies, scrubber)
    messages = [{"role": "user", "content": f"{EMAIL} and {EMAIL} and {PHONE}"}, {"role": "user", "content": EMAIL}]
    out = redactor.redact(messages, "personal")
    assert out.summary.mode == "reversible"
    assert out.messages[0]["content"] == "<EMAIL_ADDRESS_1> and <EMAIL_ADDRESS_1> and <PHONE_NUMBER_1>"
    assert out.messages[1]["content"] == "<EMAIL_ADDRESS_1>"  # one value, one name, across messages
    assert out.restore == {"<EMAIL_ADDRESS_1>": EMAIL, "<PHONE_NUMBER_1>": PHONE}
    assert out.summary.entity_counts == {"EMAIL_ADDRESS": 3, "PHONE_NUMBER": 1}
    answer = redactor.restorer(out)
    assert answer.feed("Write to <EMAIL_ADDRESS_1>.") + answer.flush() == f"Write to {EMAIL}."


def test_regulated_class_is_irreversible(data_policies: DataPolicies, scrubber: TextScrubber) -> None:
    out = PresidioRedactor(data_policies, scrubber).redact([{"role": "user", "content": f"ssn {SSN}"}], "regulated")
    assert out.summary.mode == "irreversible"
    assert out.messages[0]["content"] == "ssn <US_SSN>" and out.restore == {}


def test_raw_classes_send_unchanged(data_policies: DataPolicies, scrubber: TextScrubber) -> None:
    messages = [{"role": "user", "content": EMAIL}]
    out = PresidioRedactor(data_policies, scrubber).redact(messages, "confidential")
    assert out.messages == messages and out.summary.mode == "none"


def test_unknown_class_names_the_file(data_policies: DataPolicies, scrubber: TextScrubber) -> None:
    with pytest.raises(KeyError, match=r"data_policies\.yaml"):
        PresidioRedactor(data_policies, scrubber).redact([], "secret")


def test_runs_with_the_network_blocked(monkeypatch: pytest.MonkeyPatch, data_policies: DataPolicies) -> None:
    """Build a fresh analyzer (spaCy, tldextract, phonenumbers) with every non-loopback
    connection refused: nothing may be downloaded."""
    attempts: list[Any] = []
    real_connect = socket.socket.connect

    def guarded(self: socket.socket, address: Any) -> Any:
        host = address[0] if isinstance(address, tuple) else str(address)
        if self.family == socket.AF_UNIX or host in ("127.0.0.1", "::1", "localhost"):
            return real_connect(self, address)
        attempts.append(address)
        raise OSError(f"network blocked in test: {address}")

    real_getaddrinfo = socket.getaddrinfo

    def guarded_dns(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("127.0.0.1", "::1", "localhost", None):
            return real_getaddrinfo(host, *args, **kwargs)
        attempts.append(host)
        raise OSError(f"name resolution blocked in test: {host}")

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket, "getaddrinfo", guarded_dns)
    redactor = PresidioRedactor(data_policies, TextScrubber())
    out = redactor.redact([{"role": "user", "content": PERSONAL_TEXT}], "personal")
    assert all(v not in out.messages[0]["content"] for v in RAW_VALUES)
    assert out.summary.entity_counts["EMAIL_ADDRESS"] == 1
    assert attempts == []


# ------------------------------------------------------------ the stream restorer

MAPPING = {"<EMAIL_ADDRESS_1>": EMAIL, "<CREDIT_CARD_12>": CARD, "<IBAN_CODE_1>": IBAN}
ANSWER = "Dear <EMAIL_ADDRESS_1>, card <CREDIT_CARD_12> < 3 <b> <UNKNOWN_9> <IBAN_CODE_1><EMAIL_ADDRESS_1>"
RESTORED = f"Dear {EMAIL}, card {CARD} < 3 <b> <UNKNOWN_9> {IBAN}{EMAIL}"


def _stream(restorer: PlaceholderRestorer, chunks: list[str]) -> str:
    return "".join(restorer.feed(c) for c in chunks) + restorer.flush()


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=len(ANSWER)), max_size=12))
def test_placeholders_straddling_chunks_are_restored(cuts: list[int]) -> None:
    bounds = [0, *sorted(cuts), len(ANSWER)]
    chunks = [ANSWER[a:b] for a, b in itertools.pairwise(bounds)]
    assert _stream(PlaceholderRestorer(MAPPING), chunks) == RESTORED


def test_text_that_cannot_become_a_placeholder_is_not_held() -> None:
    r = PlaceholderRestorer(MAPPING)
    assert r.feed("a < b") == "a < b"
    assert r.feed("x <EMAIL_") == "x "  # might still be one
    assert r.feed("ADDRESS_1> ok") == f"{EMAIL} ok"
    assert r.feed("<" + "A" * 40) == "<" + "A" * 40  # longer than any placeholder: released


def test_unterminated_tail_is_flushed_verbatim() -> None:
    r = PlaceholderRestorer(MAPPING)
    assert r.feed("end <EMAIL_ADD") == "end "
    assert r.flush() == "<EMAIL_ADD"
