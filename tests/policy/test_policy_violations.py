"""Every kind of policy violation is reported with the file, the field and the reason."""

from __future__ import annotations

from pathlib import Path

import pytest

from switchyard.cli import main
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import MAX_DEADLINE_MS


def violations(root: Path) -> list[str]:
    with pytest.raises(PolicyError) as info:
        load_policy_set(root)
    return [str(v) for v in info.value.violations]


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"test setup: {old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def test_team_budget_above_org_cap(policies_copy: Path) -> None:
    edit(policies_copy / "teams/search.yaml", "month_usd: 6000", "month_usd: 9000")
    found = violations(policies_copy)
    assert found == [
        "teams/search.yaml: budget.month_usd: the team sets 9000.0, above the org cap of 8000.0 "
        "(org.yaml guardrails: max)"
    ]


def test_flow_budget_above_org_cap_names_the_flow(policies_copy: Path) -> None:
    edit(policies_copy / "teams/ads.yaml", "  assistant:\n", "  assistant:\n    budget: {day_usd: 900}\n")
    assert any(
        v.startswith("teams/ads.yaml: flows.assistant.budget.day_usd: the team sets 900")
        for v in violations(policies_copy)
    )


def test_data_class_below_floor(policies_copy: Path) -> None:
    edit(policies_copy / "teams/sales.yaml", "data_class: internal", "data_class: public")
    found = violations(policies_copy)
    assert any("teams/sales.yaml: defaults.data_class" in v and "below the org floor 'internal'" in v for v in found)


def test_a_floor_naming_a_data_class_that_is_gone_is_named(policies_copy: Path) -> None:
    """Found by the generated policy mutations (stop 44): with the class an org guardrail's
    `min_class` names deleted from data_policies.yaml, `policy check` raised KeyError while
    ranking a team's data class against it."""
    edit(
        policies_copy / "data_policies.yaml",
        "  internal:\n    rank: 1\n    send: raw\n    store_input: full\n    store_output: full\n"
        "    retention_days: 90\n",
        "",
    )
    found = violations(policies_copy)
    assert (
        "org.yaml: guardrails.data_class.min_class: unknown data class 'internal' "
        "(known: confidential, personal, public, regulated)" in found
    ), found


def test_provider_outside_org_set(policies_copy: Path) -> None:
    edit(
        policies_copy / "teams/legal.yaml",
        "allowed_providers: [azure-openai, local]",
        "allowed_providers: [azure-openai, local, mystery-llm]",
    )
    found = violations(policies_copy)
    assert any("teams/legal.yaml: allowed_providers" in v and "mystery-llm" in v for v in found), found


def test_locked_field(policies_copy: Path) -> None:
    edit(policies_copy / "org.yaml", "guardrails:\n", "guardrails:\n  risk_tier: {locked: true}\n")
    found = violations(policies_copy)
    assert (
        "teams/payments.yaml: flows.dispute-review.risk_tier: is locked by org.yaml guardrails; the team sets 'high'"
        in {v.replace("<RiskTier.HIGH: 'high'>", "'high'") for v in found}
    )


def test_dangling_references(policies_copy: Path) -> None:
    edit(policies_copy / "teams/mobile.yaml", "prompt: summarise@1", "prompt: summarise@7")
    edit(policies_copy / "teams/marketing.yaml", "model: claude-haiku\n", "model: claude-opus-99\n")
    edit(policies_copy / "teams/analytics.yaml", "default_flow: assistant", "default_flow: dashboards")
    found = violations(policies_copy)
    assert any("teams/mobile.yaml: flows.summarise.prompt: prompt 'summarise' has no version 7" in v for v in found)
    assert any("teams/marketing.yaml: flows.assistant.model: unknown model 'claude-opus-99'" in v for v in found)
    assert any("teams/analytics.yaml: default_flow: names flow 'dashboards'" in v for v in found)


def test_editing_a_published_prompt_version(policies_copy: Path) -> None:
    edit(policies_copy / "prompts/summarise.yaml", "at most", "at least")
    found = violations(policies_copy)
    assert len(found) == 1 and found[0].startswith("prompts/summarise.yaml: versions.0: version 1 was edited")


def test_syntax_typo_and_name_mismatch(policies_copy: Path) -> None:
    edit(policies_copy / "teams/people.yaml", "default_flow: assistant", "default_flow: assistant\nbudgte: {}")
    (policies_copy / "teams/broken.yaml").write_text("team: broken\nflows: [\n")
    edit(policies_copy / "teams/sales.yaml", "team: sales", "team: salez")
    found = violations(policies_copy)
    assert any(v.startswith("teams/people.yaml: budgte: Extra inputs are not permitted") for v in found), found
    assert any(v.startswith("teams/broken.yaml: line") and "not valid YAML" in v for v in found), found
    assert any("teams/sales.yaml: team: team 'salez' must match the file name 'sales'" in v for v in found), found


def test_cli_check_lists_violations_and_exits_nonzero(policies_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["policy", "check", str(policies_copy)]) == 0
    edit(policies_copy / "teams/search.yaml", "month_usd: 6000", "month_usd: 9000")
    assert main(["policy", "check", str(policies_copy)]) == 1
    out = capsys.readouterr().out
    assert "1 violation(s)" in out and "teams/search.yaml: budget.month_usd" in out


def test_eval_threshold_below_the_org_floor(policies_copy: Path) -> None:
    """A team may not pass its own high-risk fallbacks with a lax eval gate (org.yaml `min`)."""
    edit(policies_copy / "teams/payments.yaml", "threshold: 0.95", "threshold: 0.5")
    assert violations(policies_copy) == [
        "teams/payments.yaml: flows.dispute-review.eval.threshold: the team sets 0.5, below the org floor "
        "of 0.9 (org.yaml guardrails: min)"
    ]
    edit(policies_copy / "teams/payments.yaml", "threshold: 0.5", "threshold: 0.9")  # at the floor: allowed
    load_policy_set(policies_copy)


def test_min_floors_any_numeric_field(policies_copy: Path) -> None:
    edit(policies_copy / "org.yaml", "guardrails:\n", "guardrails:\n  deadline_ms: {min: 1000, max: 120000}\n")
    edit(policies_copy / "org.yaml", "  deadline_ms: {max: 120000}\n", "")
    edit(policies_copy / "teams/ads.yaml", "  assistant:\n", "  assistant:\n    deadline_ms: 10\n")
    assert any(
        v.startswith("teams/ads.yaml: flows.assistant.deadline_ms: the team sets 10, below the org floor of 1000")
        for v in violations(policies_copy)
    )


def test_a_floor_above_the_ceiling_is_an_error(policies_copy: Path) -> None:
    edit(policies_copy / "org.yaml", "  max_tokens: {max: 8192}", "  max_tokens: {max: 8192, min: 9000}")
    found = violations(policies_copy)
    assert any("org.yaml: guardrails.max_tokens" in v and "min (9000.0) is above max" in v for v in found), found


def test_a_deadline_longer_than_any_request_may_run_is_named_at_its_layer(policies_copy: Path) -> None:
    """Stop 48: with the org's guardrail raised, `policy check` passed a flow deadline of 10
    minutes (and the org's defaults have no guardrail at all), and a running gateway reloaded
    it, though a budget hold expires, and an idempotency claim lapses, before such a request
    ends; a replica restarted on it refused to start."""
    edit(policies_copy / "org.yaml", "deadline_ms: {max: 120000}", "deadline_ms: {max: 900000}")
    edit(policies_copy / "org.yaml", "  deadline_ms: 30000", "  deadline_ms: 200000")
    edit(policies_copy / "teams/legal.yaml", "deadline_ms: 60000", "deadline_ms: 600000")
    found = violations(policies_copy)
    why = "ms is longer than any request may run (120000 ms): the gateway's budget holds and idempotency claims"
    assert f"org.yaml: defaults.deadline_ms: 200000 {why}" in "\n".join(found)
    assert f"teams/legal.yaml: flows.clause-review.deadline_ms: 600000 {why}" in "\n".join(found)
    assert len(found) == 2


def test_the_longest_deadline_allowed_loads(policies_copy: Path) -> None:
    edit(policies_copy / "teams/legal.yaml", "deadline_ms: 60000", f"deadline_ms: {MAX_DEADLINE_MS}")
    assert load_policy_set(policies_copy).teams["legal"].flows["clause-review"].deadline_ms == MAX_DEADLINE_MS
