"""The eval records of the current policy set, read once per policy change.

Records and suites are YAML under `policies/evals/`, so they are part of the policy set's
fingerprint: writing a record (`switchyard eval run`) is picked up by the next reload. A
record counts only with a valid signature from the state directory's eval signing key
(`eval_signing.py`); one without is ignored with a warning, as if it were not there.
"""

from __future__ import annotations

import logging

from switchyard.gateway.eval_signing import EvalSigner, signature_problem
from switchyard.gateway.evals import (
    EvalFileError,
    EvalRecord,
    EvalVerdict,
    judge_record,
    load_record,
    record_path,
)
from switchyard.policy.models import EffectiveFlow, ModelEntry
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)


class EvalBook:
    def __init__(self, signatures: EvalSigner | None = None) -> None:
        """`signatures`: the deployment's eval signing key. Without it no record counts
        (fail closed: a gateway built without one never falls back on a high-risk flow)."""
        self._signatures = signatures
        self._policy_set: PolicySet | None = None
        # A record that may count, or the verdict that a present record does not.
        self._records: dict[tuple[str, str, str], EvalRecord | EvalVerdict | None] = {}

    def judge(
        self, ps: PolicySet, flow: EffectiveFlow, model: str, entry: ModelEntry, prompt_sha256: str
    ) -> EvalVerdict:
        if flow.eval is None:
            return EvalVerdict(False, "no_eval_gate")
        record = self._record(ps, flow.team, flow.flow, model)
        if isinstance(record, EvalVerdict):
            return record
        return judge_record(
            record,
            model_version=entry.model_version,
            prompt_sha256=prompt_sha256,
            suite=flow.eval.suite,
            suite_sha256=ps.file_hashes.get(f"evals/suites/{flow.eval.suite}"),
            threshold=flow.eval.threshold,
        )

    def _record(self, ps: PolicySet, team: str, flow: str, model: str) -> EvalRecord | EvalVerdict | None:
        if ps is not self._policy_set:  # identity: a reload always makes a new PolicySet
            self._records = {}
            self._policy_set = ps
        key = (team, flow, model)
        if key not in self._records:
            self._records[key] = self._load(ps, team, flow, model)
        return self._records[key]

    def _load(self, ps: PolicySet, team: str, flow: str, model: str) -> EvalRecord | EvalVerdict | None:
        path = record_path(ps.root, team, flow, model)
        if not path.exists():
            return None
        try:
            record = load_record(path)
        except EvalFileError as exc:
            log.error("ignoring an unreadable eval record, so %s is no fallback for %s/%s: %s", model, team, flow, exc)
            return None
        problem = signature_problem(record, self._signatures)
        if problem is not None:
            log.warning(
                "ignoring eval record %s (%s: run `switchyard eval run` to make a signed one), "
                "so %s is no fallback for %s/%s",
                path,
                problem,
                model,
                team,
                flow,
            )
            return EvalVerdict(False, problem)
        return record
