"""`switchyard eval run` against the fake upstream: the record it writes makes the candidate
a valid fallback, and editing the suite makes the record stale."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from gw_fakes import FakeUpstreams

from switchyard.cli import main
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.evals import load_record, record_path
from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set


def _answers(upstreams: FakeUpstreams, correct: bool) -> None:
    from gw_fakes import Fault

    upstreams.reset()
    expected = [True, False, True, False, True]  # the shipped suite's expectations, in order
    for escalate in expected:
        value = escalate if correct else not escalate
        upstreams.bedrock.faults.append(Fault("reply", text=json.dumps({"escalate": value, "reason": "r"})))


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
    code = main(
        [
            "eval",
            "run",
            "--flow",
            "payments/dispute-review",
            "--candidate",
            "bedrock-claude-sonnet",
            "--policies",
            str(policies),
        ]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["score"] == 1.0 and out["passed"] is True
    record = load_record(record_path(policies, "payments", "dispute-review", "bedrock-claude-sonnet"))
    assert record.cases == 5 and record.prompt_ref.startswith("payment-risk@1#")
    ps = load_policy_set(policies)
    flow = resolve_flow(ps, "payments", "dispute-review")
    assert not isinstance(flow, list)
    entry = ps.providers.models["bedrock-claude-sonnet"]
    version = ps.prompts["payment-risk"].get(1)
    assert version is not None
    assert EvalBook().judge(ps, flow.policy, "bedrock-claude-sonnet", entry, version.content_hash()).ok
    # Editing the suite changes its hash: the record is stale and no longer gates fallback.
    suite = policies / "evals" / "suites" / "payment-risk.yaml"
    suite.write_text(suite.read_text() + "\n# one more comment\n")
    ps = load_policy_set(policies)
    verdict = EvalBook().judge(ps, flow.policy, "bedrock-claude-sonnet", entry, version.content_hash())
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
    code = main(
        [
            "eval",
            "run",
            "--flow",
            "payments/dispute-review",
            "--candidate",
            "bedrock-claude-sonnet",
            "--policies",
            str(policies),
        ]
    )
    assert code == 1 and json.loads(capsys.readouterr().out)["score"] == 0.0


def test_eval_run_names_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "run", "--flow", "payments", "--candidate", "x"]) == 2
    assert "TEAM/FLOW" in capsys.readouterr().err
