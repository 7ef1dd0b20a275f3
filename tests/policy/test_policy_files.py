"""Policy files that cannot be read, decoded or parsed are violations naming the file and the
line; each file is read once, and the set's hashes are of the bytes it parsed."""

from __future__ import annotations

import dataclasses
import hashlib
import time
from pathlib import Path

import pytest

from switchyard.config_file import ConfigFile
from switchyard.policy import loader
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set


def violations(root: Path) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_set(root)
    return [str(v) for v in info.value.violations]


def test_invalid_utf8_names_the_file_and_line(policies_copy: Path) -> None:
    ads = policies_copy / "teams/ads.yaml"
    ads.write_bytes(ads.read_bytes().replace(b"Ad copy generation.", "Ad copy génération.".encode("latin-1")))
    found = violations(policies_copy)
    assert any(v.startswith("teams/ads.yaml: line 2: not valid UTF-8") for v in found), found


def test_duplicate_key_names_both_lines(policies_copy: Path) -> None:
    ads = policies_copy / "teams/ads.yaml"
    text = ads.read_text()
    assert "defaults:\n  data_class: internal\n" in text
    ads.write_text(text.replace("defaults:\n", "defaults:\n  data_class: personal\n", 1))  # line 6; internal is line 7
    found = violations(policies_copy)
    assert any(
        v.startswith("teams/ads.yaml: defaults.data_class: duplicate key") and "line 6" in v and "line 7" in v
        for v in found
    ), found


BOMB = "lol0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"lol{i}: &l{i} [{', '.join([f'*l{i - 1}'] * 9)}]\n" for i in range(1, 10)
)  # 9 levels of 9: 9**9 (387 million) nodes once expanded


def test_alias_bomb_fails_fast(policies_copy: Path) -> None:
    (policies_copy / "teams/ads.yaml").write_text(BOMB)
    started = time.monotonic()
    found = violations(policies_copy)
    assert time.monotonic() - started < 1.0
    assert any(v.startswith("teams/ads.yaml: aliases expand to more than") for v in found), found


def test_oversized_file_is_rejected_without_reading_it(policies_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with (policies_copy / "teams/ads.yaml").open("wb") as f:
        f.truncate(50 * 1024 * 1024)  # sparse: 50 MB by size, nothing written
    parsed: list[str] = []
    real_parse = loader.parse_yaml
    monkeypatch.setattr(loader, "parse_yaml", lambda raw, name: parsed.append(name) or real_parse(raw, name))
    started = time.monotonic()
    found = violations(policies_copy)
    assert time.monotonic() - started < 1.0
    assert "teams/ads.yaml: file is 52428800 bytes or more, over the limit of 4194304 bytes" in found, found
    assert "teams/ads.yaml" not in parsed


def test_missing_required_file(policies_copy: Path) -> None:
    (policies_copy / "providers.yaml").unlink()
    assert "providers.yaml: cannot read: file is missing" in violations(policies_copy)


def test_file_deleted_between_listing_and_reading(policies_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real_listing = loader.policy_files
    monkeypatch.setattr(loader, "policy_files", lambda root: [*real_listing(root), root / "teams/gone.yaml"])
    assert "teams/gone.yaml: cannot read: file is missing" in violations(policies_copy)


def test_hashes_and_sources_are_the_bytes_parsed(policies_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file rewritten right after it was parsed: the set's hash is still of what was parsed."""
    ads = policies_copy / "teams/ads.yaml"
    parsed_bytes = ads.read_bytes()
    real_parse = loader.parse_yaml

    def parse_then_rewrite(raw: bytes, name: str) -> ConfigFile:
        doc = real_parse(raw, name)
        if name == "teams/ads.yaml":
            ads.write_text(parsed_bytes.decode().replace("Ad copy generation.", "Rewritten."))
        return doc

    monkeypatch.setattr(loader, "parse_yaml", parse_then_rewrite)
    ps = load_policy_set(policies_copy)
    assert ps.teams["ads"].description == "Ad copy generation."
    assert ps.sources["teams/ads.yaml"] == parsed_bytes
    assert ps.file_hashes["teams/ads.yaml"] == hashlib.sha256(parsed_bytes).hexdigest()
    assert ps.file_hashes == {k: hashlib.sha256(v).hexdigest() for k, v in ps.sources.items()}
    assert "evals/suites/payment-risk.yaml" in ps.sources
    assert set(ps.file_hashes) == {str(p.relative_to(ps.root)) for p in loader.policy_files(ps.root)}


def test_sources_are_not_part_of_equality_or_fingerprint(policies_copy: Path) -> None:
    ps = load_policy_set(policies_copy)
    bare = dataclasses.replace(ps, sources={})
    assert bare == ps and bare.fingerprint == ps.fingerprint and "sources=" not in repr(ps)


def test_a_validation_error_names_field_and_line(policies_copy: Path) -> None:
    edit = policies_copy / "teams/ads.yaml"
    edit.write_text(edit.read_text().replace("    max_tokens: 512\n", "    max_tokens: lots\n"))
    found = violations(policies_copy)
    assert any(v.startswith("teams/ads.yaml: flows.summarise.max_tokens: ") and v.endswith("(line 23)") for v in found)
    assert not any("lots" in v for v in found), found  # input values are never echoed


def test_an_eval_suite_that_does_not_parse_is_a_violation_naming_it(policies_copy: Path) -> None:
    """Found by the generated policy changes (stop 43): an eval suite is part of the policy set
    (hashed, and `policy check` passed), but nothing parsed it until `switchyard eval run` did,
    which then failed on a set that had passed its check."""
    (policies_copy / "evals" / "suites" / "payment-risk.yaml").write_text("description: no cases\ncases: []\n")
    [problem] = violations(policies_copy)
    assert problem.startswith("evals/suites/payment-risk.yaml: cases") and "at least 1" in problem, problem


def test_a_flow_naming_an_eval_suite_that_is_not_there_is_a_violation(policies_copy: Path) -> None:
    (policies_copy / "evals" / "suites" / "payment-risk.yaml").rename(
        policies_copy / "evals" / "suites" / "payment-risk-old.yaml"
    )
    found = violations(policies_copy)
    assert any(
        v.startswith("teams/payments.yaml: flows.") and "unknown eval suite 'payment-risk.yaml'" in v for v in found
    ), found
