"""A running component reloads policies on change; an invalid set never replaces a valid one."""

from __future__ import annotations

import json
from pathlib import Path

from switchyard.policy.store import PolicyStore


def test_valid_change_takes_effect_and_is_journaled(policies_copy: Path, tmp_path: Path) -> None:
    store = PolicyStore(policies_copy, tmp_path)
    before = store.current.fingerprint
    assert store.refresh() is False  # nothing changed
    team = policies_copy / "teams/search.yaml"
    team.write_text(team.read_text().replace("month_usd: 6000", "month_usd: 5000"))
    assert store.refresh() is True
    assert store.current.teams["search"].budget is not None
    assert store.current.teams["search"].budget.month_usd == 5000
    assert store.current.fingerprint != before and store.last_error is None
    journal = [json.loads(line) for line in (tmp_path / "policy_changes.jsonl").read_text().splitlines()]
    assert [j["applied"] for j in journal] == [True, True]
    assert journal[-1]["files"]["teams/search.yaml"] != journal[0]["files"]["teams/search.yaml"]


def test_invalid_change_keeps_the_last_valid_set(policies_copy: Path, tmp_path: Path) -> None:
    store = PolicyStore(policies_copy, tmp_path)
    valid = store.current
    team = policies_copy / "teams/search.yaml"
    team.write_text(team.read_text().replace("month_usd: 6000", "month_usd: 60000"))
    assert store.refresh() is False
    assert store.current is valid
    assert store.last_error is not None and "teams/search.yaml: budget.month_usd" in store.last_error
    assert store.status()["last_error"] == store.last_error
    journal = [json.loads(line) for line in (tmp_path / "policy_changes.jsonl").read_text().splitlines()]
    assert journal[-1]["applied"] is False and "month_usd" in journal[-1]["error"]
    # Fixing the file clears the error.
    team.write_text(team.read_text().replace("month_usd: 60000", "month_usd: 6000"))
    assert store.refresh() is True and store.last_error is None


def test_a_deadline_no_replica_could_start_on_is_not_reloaded(policies_copy: Path, tmp_path: Path) -> None:
    """Stop 48: a running gateway reloaded a set whose flow ran 10 minutes, past what its budget
    holds and idempotency claims outlive; only a replica starting on it refused it."""
    store = PolicyStore(policies_copy, tmp_path)
    valid = store.current
    org = policies_copy / "org.yaml"
    org.write_text(org.read_text().replace("deadline_ms: {max: 120000}", "deadline_ms: {max: 900000}"))
    team = policies_copy / "teams/legal.yaml"
    team.write_text(team.read_text().replace("deadline_ms: 60000", "deadline_ms: 600000"))
    assert store.refresh() is False
    assert store.current is valid and store.degraded
    assert store.last_error is not None and "teams/legal.yaml: flows.clause-review.deadline_ms" in store.last_error
