"""Eval suites and the records that let a high-risk flow fall back to a candidate.

A suite (`policies/evals/suites/<name>.yaml`) lists cases: prompt variables, optional client
messages, and what the answer must contain. A record
(`policies/evals/records/<team>/<flow>/<candidate>.yaml`) says how a candidate scored, bound
to the candidate's model version, the prompt version's content hash and the suite's sha256.
When any of the three changes the record is stale, and the candidate is not a fallback. A
record counts only when signed with the state directory's eval signing key (`eval_signing.py`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ConfigDict

from switchyard.config_file import ConfigFileError, read_yaml, validate
from switchyard.gateway import json_text
from switchyard.policy.eval_suites import SUITES_FOLDER, EvalCase, EvalSuite

M = TypeVar("M", bound=BaseModel)


class EvalRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    team: str
    flow: str
    candidate: str  # catalog model name
    model_version: str
    prompt_ref: str  # "id@version#hash12" the suite ran with
    prompt_sha256: str
    suite: str
    suite_sha256: str
    threshold: float
    score: float
    cases: int
    passed_cases: int
    run_at: str
    # Who ran it and the proof: see `switchyard.gateway.eval_signing`. A record without a valid
    # signature is ignored, so no fallback rests on a record anyone could have written.
    signed_by: str | None = None  # the key id of the operator principal that ran the suite
    signature: str | None = None  # "hmac-sha256:<hex>" over every other field


class EvalFileError(Exception):
    """A suite or record file that cannot be read; names the file and the field."""


def suite_path(policies_dir: Path, suite: str) -> Path:
    return policies_dir / SUITES_FOLDER / suite


def record_path(policies_dir: Path, team: str, flow: str, candidate: str) -> Path:
    return policies_dir / "evals" / "records" / team / flow / f"{candidate}.yaml"


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load_suite(path: Path) -> EvalSuite:
    return _load(path, EvalSuite)


def load_record(path: Path) -> EvalRecord:
    return _load(path, EvalRecord)


def _load(path: Path, model: type[M]) -> M:
    try:
        return validate(read_yaml(path), model)
    except ConfigFileError as exc:  # callers catch EvalFileError: the same message, naming file, line and field
        raise EvalFileError(str(exc)) from None


def write_record(path: Path, record: EvalRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(record.model_dump(), sort_keys=True))
    tmp.replace(path)  # atomic: a gateway reloading policies never reads half a record


@dataclass(frozen=True)
class EvalVerdict:
    ok: bool
    # "eval_passed", "no_eval_record", "unsigned_eval_record", "bad_eval_signature",
    # "stale_eval_record:<what>", "eval_below_threshold"
    reason: str


def judge_record(
    record: EvalRecord | None,
    *,
    model_version: str,
    prompt_sha256: str,
    suite: str,
    suite_sha256: str | None,
    threshold: float,
) -> EvalVerdict:
    if record is None:
        return EvalVerdict(False, "no_eval_record")
    stale = [
        what
        for what, ok in (
            ("model_version", record.model_version == model_version),
            ("prompt", record.prompt_sha256 == prompt_sha256),
            ("suite", record.suite == suite and record.suite_sha256 == suite_sha256),
        )
        if not ok
    ]
    if stale:
        return EvalVerdict(False, "stale_eval_record:" + ",".join(stale))
    if record.score < threshold:
        return EvalVerdict(False, "eval_below_threshold")
    return EvalVerdict(True, "eval_passed")


def case_passes(case: EvalCase, answer: str) -> bool:
    if case.expect_contains is not None and case.expect_contains not in answer:
        return False
    if case.expect_json is not None:
        try:
            parsed = json_text.loads(answer)
        except ValueError:
            return False
        if not isinstance(parsed, dict):
            return False
        return all(parsed.get(k) == v for k, v in case.expect_json.items())
    return True
