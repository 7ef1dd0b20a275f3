"""The eval records of the current policy set, read once per policy change.

Records and suites are YAML under `policies/evals/`, so they are part of the policy set's
fingerprint: writing a record (`switchyard eval run`) is picked up by the next reload.
"""

from __future__ import annotations

import logging

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
    def __init__(self) -> None:
        self._policy_set: PolicySet | None = None
        self._records: dict[tuple[str, str, str], EvalRecord | None] = {}

    def judge(
        self, ps: PolicySet, flow: EffectiveFlow, model: str, entry: ModelEntry, prompt_sha256: str
    ) -> EvalVerdict:
        if flow.eval is None:
            return EvalVerdict(False, "no_eval_gate")
        record = self._record(ps, flow.team, flow.flow, model)
        return judge_record(
            record,
            model_version=entry.model_version,
            prompt_sha256=prompt_sha256,
            suite=flow.eval.suite,
            suite_sha256=ps.file_hashes.get(f"evals/suites/{flow.eval.suite}"),
            threshold=flow.eval.threshold,
        )

    def _record(self, ps: PolicySet, team: str, flow: str, model: str) -> EvalRecord | None:
        if ps is not self._policy_set:  # identity: a reload always makes a new PolicySet
            self._records = {}
            self._policy_set = ps
        key = (team, flow, model)
        if key not in self._records:
            path = record_path(ps.root, team, flow, model)
            record: EvalRecord | None = None
            if path.exists():
                try:
                    record = load_record(path)
                except EvalFileError as exc:
                    log.error(
                        "ignoring an unreadable eval record, so %s is no fallback for %s/%s: %s", model, team, flow, exc
                    )
            self._records[key] = record
        return self._records[key]
