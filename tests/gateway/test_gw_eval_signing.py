"""Eval records count only when signed with the state directory's eval signing key."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime
from pathlib import Path

import pytest
from gw_harness import make_policies

from switchyard.gateway.eval_signing import EvalSigner
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.evals import EvalRecord, EvalVerdict, load_record, record_path, write_record
from switchyard.policy.layering import resolve_flow
from switchyard.policy.loader import load_policy_set
from switchyard.policy.policy_set import PolicySet

CANDIDATE = "bedrock-claude-sonnet"


@pytest.fixture
def ps(tmp_path: Path) -> PolicySet:
    return load_policy_set(make_policies(tmp_path / "policies", "http://127.0.0.1:9"))


def valid_record(ps: PolicySet) -> EvalRecord:
    version = ps.prompts["payment-risk"].get(1)
    assert version is not None
    suite = ps.root / "evals" / "suites" / "payment-risk.yaml"
    return EvalRecord(
        team="payments",
        flow="dispute-review",
        candidate=CANDIDATE,
        model_version=ps.providers.models[CANDIDATE].model_version,
        prompt_ref=f"payment-risk@1#{version.content_hash()[:12]}",
        prompt_sha256=version.content_hash(),
        suite="payment-risk.yaml",
        suite_sha256=hashlib.sha256(suite.read_bytes()).hexdigest(),
        threshold=0.95,
        score=1.0,
        cases=2,
        passed_cases=2,
        run_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def judge(book: EvalBook, root: Path) -> EvalVerdict:
    ps = load_policy_set(root)  # a new policy set, as a reload after writing a record makes
    flow = resolve_flow(ps, "payments", "dispute-review")
    assert not isinstance(flow, list)
    version = ps.prompts["payment-risk"].get(1)
    assert version is not None
    return book.judge(ps, flow.policy, CANDIDATE, ps.providers.models[CANDIDATE], version.content_hash())


def test_unsigned_record_is_ignored(ps: PolicySet, tmp_path: Path) -> None:
    """Regression: an unsigned record with the right hashes and a perfect score made the
    candidate a fallback of a high-risk flow."""
    signer = EvalSigner.in_state_dir(tmp_path / "state")
    signer.sign(valid_record(ps), "k1")  # the deployment has a signing key: the record is checkable
    write_record(path_of(ps), valid_record(ps))
    verdict = judge(EvalBook(signer), ps.root)
    assert not verdict.ok and verdict.reason == "unsigned_eval_record"


def path_of(ps: PolicySet) -> Path:
    return record_path(ps.root, "payments", "dispute-review", CANDIDATE)


def test_signed_record_counts(ps: PolicySet, tmp_path: Path) -> None:
    state = tmp_path / "state"
    signed = EvalSigner.in_state_dir(state).sign(valid_record(ps), "k1")
    assert signed.signed_by == "k1" and signed.signature and signed.signature.startswith("hmac-sha256:")
    write_record(path_of(ps), signed)
    verdict = judge(EvalBook(EvalSigner.in_state_dir(state)), ps.root)  # a fresh reader, as a gateway is
    assert verdict.ok and verdict.reason == "eval_passed"
    assert (state / "eval_signing.key").stat().st_mode & 0o777 == 0o600


def test_signature_survives_the_yaml_round_trip(ps: PolicySet, tmp_path: Path) -> None:
    signer = EvalSigner.in_state_dir(tmp_path / "state")
    awkward = valid_record(ps).model_copy(update={"score": 1 / 3, "threshold": 1e-05, "passed_cases": 1})
    write_record(path_of(ps), signer.sign(awkward, "k1"))
    assert signer.problem(load_record(path_of(ps))) is None


@pytest.mark.parametrize(
    "tamper",
    [
        {"score": 1.0, "passed_cases": 2},  # a failing run's score raised by hand
        {"signed_by": "someone-else"},  # the signature is another principal's
        {"model_version": "another-model-version"},  # moved onto another model
    ],
)
def test_tampered_record_is_ignored(ps: PolicySet, tmp_path: Path, tamper: dict[str, object]) -> None:
    signer = EvalSigner.in_state_dir(tmp_path / "state")
    failing = signer.sign(valid_record(ps).model_copy(update={"score": 0.5, "passed_cases": 1}), "k1")
    write_record(path_of(ps), failing.model_copy(update=tamper))
    verdict = judge(EvalBook(signer), ps.root)
    assert not verdict.ok and verdict.reason == "bad_eval_signature"


def test_record_signed_for_another_deployment_is_ignored(ps: PolicySet, tmp_path: Path) -> None:
    write_record(path_of(ps), EvalSigner.in_state_dir(tmp_path / "elsewhere").sign(valid_record(ps), "k1"))
    signer = EvalSigner.in_state_dir(tmp_path / "state")
    signer.sign(valid_record(ps), "k1")  # this deployment's key exists, and differs
    assert judge(EvalBook(signer), ps.root).reason == "bad_eval_signature"
    # A reader without any key (a gateway built without one) trusts no record, signed or not.
    assert judge(EvalBook(), ps.root).reason == "bad_eval_signature"
    assert judge(EvalBook(EvalSigner.in_state_dir(tmp_path / "no-key-yet")), ps.root).reason == "bad_eval_signature"


def test_signing_key_is_made_once(tmp_path: Path, ps: PolicySet) -> None:
    state = tmp_path / "state"
    record = valid_record(ps)
    first = EvalSigner.in_state_dir(state).sign(record, "k1")
    assert EvalSigner.in_state_dir(state).sign(record, "k1").signature == first.signature
    assert [p.name for p in state.iterdir()] == ["eval_signing.key"]  # no temp file left behind


def test_on_a_shared_database_every_node_checks_with_the_key_the_head_signed_with(
    ps: PolicySet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Regression: the key was a file in each node's state directory, so a record the head
    signed counted for nothing on a replica elsewhere: a high-risk flow lost its fallback there."""
    from switchyard.db.location import DATABASE_URL_ENV
    from switchyard.db.schemas import store_schemas
    from tests.shared_db import fresh_postgres, postgres_url

    fresh_postgres(*store_schemas().values()).close()
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url())
    head, node = tmp_path / "head-state", tmp_path / "node-state"
    signed = EvalSigner.in_state_dir(head).sign(valid_record(ps), signed_by="operator-key-id")
    assert not (head / "eval_signing.key").exists()  # in the database, not on the head's disk
    write_record(record_path(ps.root, "payments", "dispute-review", CANDIDATE), signed)
    assert judge(EvalBook(EvalSigner.in_state_dir(node)), ps.root) == EvalVerdict(True, "eval_passed")
    forged = signed.model_copy(update={"score": 0.99})
    assert EvalSigner.in_state_dir(node).problem(forged) == "bad_eval_signature"


def test_moving_to_a_shared_database_adopts_the_heads_key_file(
    ps: PolicySet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Records signed before the move keep counting: the head's key file becomes the shared key."""
    from switchyard.db.location import DATABASE_URL_ENV
    from switchyard.db.schemas import store_schemas
    from tests.shared_db import fresh_postgres, postgres_url

    head = tmp_path / "head-state"
    before = EvalSigner.in_state_dir(head).sign(valid_record(ps), signed_by="operator-key-id")  # the file key
    fresh_postgres(*store_schemas().values()).close()
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url())
    later = EvalSigner.in_state_dir(head).sign(valid_record(ps), signed_by="operator-key-id")
    assert EvalSigner.in_state_dir(tmp_path / "node-state").problem(before) is None
    assert EvalSigner.in_state_dir(tmp_path / "node-state").problem(later) is None
