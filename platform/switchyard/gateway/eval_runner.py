"""Running a flow's eval suite against one candidate model, producing an `EvalRecord`.

Each case is rendered with the flow's pinned prompt version exactly as the gateway would
render it, sent to the candidate, checked against the flow's output contract and the case's
expectations. The record binds the score to the candidate's model version, the prompt
version's content hash and the suite file's sha256.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from switchyard.gateway.contracts import OutputContracts, flow_spec
from switchyard.gateway.errors import GatewayError
from switchyard.gateway.evals import EvalRecord, case_passes, file_sha256, load_suite, suite_path
from switchyard.gateway.prompting import CompiledPrompts, VariableSchemas, choose_version, render_messages
from switchyard.gateway.providers.base import ChatProvider, ProviderCall, ProviderError
from switchyard.policy.models import EffectiveFlow
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.prompts import prompt_ref

log = logging.getLogger(__name__)


class EvalSetupError(Exception):
    """The flow has no eval gate, or the suite is missing or invalid."""


async def run_suite(
    ps: PolicySet, flow: EffectiveFlow, candidate: str, provider: ChatProvider, timeout_s: float = 60.0
) -> EvalRecord:
    if flow.eval is None:
        raise EvalSetupError(
            f"flow {flow.team}/{flow.flow} has no `eval` gate (suite, threshold) in teams/{flow.team}.yaml"
        )
    if candidate not in ps.providers.models:
        raise EvalSetupError(f"unknown candidate model {candidate!r} (not in providers.yaml models)")
    path = suite_path(ps.root, flow.eval.suite)
    if not path.exists():
        raise EvalSetupError(
            f"{path}: the eval suite named by teams/{flow.team}.yaml flows.{flow.flow}.eval.suite does not exist"
        )
    suite = load_suite(path)
    entry = ps.providers.models[candidate]
    version = choose_version(ps, flow, None)
    prompts, schemas, contracts = CompiledPrompts(), VariableSchemas(), OutputContracts()
    spec = flow_spec(flow)
    passed = 0
    for case in suite.cases:
        try:
            schemas.validate(flow, case.variables)
            rendered = render_messages(prompts, flow, version, case.variables, case.messages)
            done = await provider.complete(
                ProviderCall(
                    candidate,
                    entry.model_version,
                    list(rendered.messages),
                    flow.max_tokens,
                    timeout_s,
                    f"eval-{case.name}",
                    output=None if spec is None else spec.as_format(entry.capabilities.json_schema),
                )
            )
        except (GatewayError, ProviderError) as exc:
            log.warning("eval case %s failed before an answer: %s", case.name, exc)
            continue
        ok = contracts.problem(spec, done.text) is None and case_passes(case, done.text)
        passed += ok
        log.info("eval case %s: %s", case.name, "pass" if ok else "fail")
    return EvalRecord(
        team=flow.team,
        flow=flow.flow,
        candidate=candidate,
        model_version=entry.model_version,
        prompt_ref=prompt_ref(flow.prompt_id, version),
        prompt_sha256=version.content_hash(),
        suite=flow.eval.suite,
        suite_sha256=file_sha256(path),
        threshold=flow.eval.threshold,
        score=passed / len(suite.cases),
        cases=len(suite.cases),
        passed_cases=passed,
        run_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
