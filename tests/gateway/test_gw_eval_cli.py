"""`switchyard eval run` against the fake upstream: the record it writes (signed) makes the
candidate a valid fallback, and editing the suite makes the record stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gw_fakes import FakeUpstreams

from switchyard.cli import main
from switchyard.gateway.eval_signing import EvalSigner
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.evals import load_record, record_path
from switchyard.policy.keys import KeyStore
from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import Role


def _answers(upstreams: FakeUpstreams, correct: bool) -> None:
    from gw_fakes import Fault

    upstreams.reset()
    expected = [True, False, True, False, True]  # the shipped suite's expectations, in order
    for escalate in expected:
        value = escalate if correct else not escalate
        upstreams.bedrock.faults.append(Fault("reply", text=json.dumps({"escalate": value, "reason": "r"})))


def _as(state: Path, role: Role, team: str = "platform") -> tuple[list[str], str]:
    """CLI arguments that act as a new key of `role`, and that key's id."""
    key, record = KeyStore.in_state_dir(state).create(team, role)
    return ["--state-dir", str(state), "--api-key", key], record.key_id


def _eval_run(policies: Path, *auth: str) -> int:
    return main(
        [
            "eval",
            "run",
            "--flow",
            "payments/dispute-review",
            "--candidate",
            "bedrock-claude-sonnet",
            "--policies",
            str(policies),
            *auth,
        ]
    )


def test_eval_run_writes_a_record_that_gates_fallback(
    gw_dirs: tuple[Path, Path, dict[str, str]],
    upstreams: FakeUpstreams,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    shutil.copy(
        Path(__file__).resolve().parents[2] / "policies" / "evals" / "suites" / "payment-risk.yaml",
        policies / "evals" / "suites" / "payment-risk.yaml",
    )
    _answers(upstreams, correct=True)
    state = gw_dirs[1]
    auth, admin_id = _as(state, Role.PLATFORM_ADMIN)
    code = _eval_run(policies, *auth)
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["score"] == 1.0 and out["passed"] is True
    record = load_record(record_path(policies, "payments", "dispute-review", "bedrock-claude-sonnet"))
    assert record.cases == 5 and record.prompt_ref.startswith("payment-risk@1#")
    assert record.signed_by == admin_id and EvalSigner.in_state_dir(state).problem(record) is None
    ps = load_policy_set(policies)
    flow = resolve_flow(ps, "payments", "dispute-review")
    assert not isinstance(flow, list)
    entry = ps.providers.models["bedrock-claude-sonnet"]
    version = ps.prompts["payment-risk"].get(1)
    assert version is not None
    book = EvalBook(EvalSigner.in_state_dir(state))
    assert book.judge(ps, flow.policy, "bedrock-claude-sonnet", entry, version.content_hash()).ok
    # Editing the suite changes its hash: the record is stale and no longer gates fallback.
    suite = policies / "evals" / "suites" / "payment-risk.yaml"
    suite.write_text(suite.read_text() + "\n# one more comment\n")
    ps = load_policy_set(policies)
    verdict = book.judge(ps, flow.policy, "bedrock-claude-sonnet", entry, version.content_hash())
    assert not verdict.ok and verdict.reason == "stale_eval_record:suite"


def test_eval_run_below_threshold_exits_1(
    gw_dirs: tuple[Path, Path, dict[str, str]],
    upstreams: FakeUpstreams,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    shutil.copy(
        Path(__file__).resolve().parents[2] / "policies" / "evals" / "suites" / "payment-risk.yaml",
        policies / "evals" / "suites" / "payment-risk.yaml",
    )
    _answers(upstreams, correct=False)
    code = _eval_run(policies, *_as(gw_dirs[1], Role.PLATFORM_ADMIN)[0])
    assert code == 1 and json.loads(capsys.readouterr().out)["score"] == 0.0


@pytest.mark.parametrize(("role", "team"), [(Role.TEAM_ADMIN, "payments"), (Role.MEMBER, "payments")])
def test_only_a_platform_admin_may_sign_eval_records(
    gw_dirs: tuple[Path, Path, dict[str, str]],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    role: Role,
    team: str,
) -> None:
    policies = tmp_path / "policies"
    shutil.copytree(gw_dirs[0], policies)
    assert _eval_run(policies, *_as(gw_dirs[1], role, team)[0]) == 3
    assert "may not manage policies for team 'payments'" in capsys.readouterr().err
    assert not record_path(policies, "payments", "dispute-review", "bedrock-claude-sonnet").exists()


def test_eval_run_names_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "run", "--flow", "payments", "--candidate", "x"]) == 2
    assert "TEAM/FLOW" in capsys.readouterr().err
