"""Layering org -> team -> flow: what a flow inherits, and who set each field."""

from __future__ import annotations

from pathlib import Path

from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set


def test_shipped_policies_load(repo: Path) -> None:
    ps = load_policy_set(repo / "policies")
    assert "demo" in ps.teams and len(ps.teams) >= 10
    assert ps.fingerprint == load_policy_set(repo / "policies").fingerprint


def test_flow_inherits_org_then_team_then_flow(repo: Path) -> None:
    ps = load_policy_set(repo / "policies")
    resolved = resolve_flow(ps, "support", "triage")
    assert not isinstance(resolved, list)
    flow, set_by = resolved.policy, resolved.provenance
    assert flow.risk_tier == "medium" and set_by["risk_tier"] == "org.yaml: defaults.risk_tier"
    assert flow.data_class == "personal" and set_by["data_class"] == "teams/support.yaml: defaults.data_class"
    assert flow.deadline_ms == 8000 and set_by["deadline_ms"] == "teams/support.yaml: flows.triage.deadline_ms"
    assert flow.allowed_providers == {"openai", "anthropic", "local"}
    assert flow.retention_days == 90  # org default, not overridden by the support team


def test_team_wide_fields_reach_flows(repo: Path) -> None:
    ps = load_policy_set(repo / "policies")
    resolved = resolve_flow(ps, "legal", "clause-review")
    assert not isinstance(resolved, list)
    assert resolved.policy.allowed_providers == {"azure-openai", "local"}
    assert resolved.provenance["allowed_providers"] == "teams/legal.yaml: allowed_providers"
    assert resolved.policy.retention_days == 30


def test_a_flow_overrides_the_team_default(policies_copy: Path) -> None:
    team = policies_copy / "teams" / "support.yaml"
    team.write_text(
        team.read_text().replace("    max_tokens: 128\n", "    max_tokens: 128\n    data_class: regulated\n")
    )
    # regulated requires hipaa, which only bedrock and local carry; the primary is openai.
    from switchyard.policy.errors import PolicyError

    try:
        load_policy_set(policies_copy)
    except PolicyError as exc:
        messages = [str(v) for v in exc.violations]
    else:
        raise AssertionError("a flow raised to 'regulated' on a non-hipaa provider must be rejected")
    assert any("teams/support.yaml: flows.triage.model" in m and "hipaa" in m for m in messages), messages
