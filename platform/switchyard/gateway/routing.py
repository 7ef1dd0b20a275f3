"""Which models a request may be answered by, in order, and when to move to the next one.

The chain is the primary (the flow's model, or the one the client asked for among those
the flow allows), then the flow's fallback candidates. A candidate is dropped, with a
reason, when its provider is not allowed for the flow, lacks a compliance tag the flow's
data class requires, or, on a high-risk flow, has no valid eval record for this flow.
A failure moves on only when the next candidate's rule lists its error class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from switchyard.gateway.errors import NotAllowed
from switchyard.gateway.evals import EvalVerdict
from switchyard.policy.models import EffectiveFlow, ErrorClass, ModelEntry, RiskTier
from switchyard.policy.policy_set import PolicySet

# Judges one fallback candidate of a high-risk flow: (flow, model name, entry) -> verdict.
EvalJudge = Callable[[EffectiveFlow, str, ModelEntry], EvalVerdict]


@dataclass(frozen=True)
class Candidate:
    model: str  # catalog name
    entry: ModelEntry
    on_errors: frozenset[ErrorClass]  # the errors of the previous candidate that lead here

    @property
    def provider(self) -> str:
        return self.entry.provider


@dataclass(frozen=True)
class Skip:
    model: str
    reason: str


@dataclass(frozen=True)
class Route:
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skip, ...]


def pick_primary(ps: PolicySet, flow: EffectiveFlow, requested: str) -> str:
    if requested == "auto" or requested == flow.model:
        return flow.model
    if requested in flow.allowed_models:
        return requested
    allowed = ", ".join(["auto", flow.model, *sorted(flow.allowed_models)])
    raise NotAllowed(
        "model_not_allowed",
        # The name sent is not repeated: error bodies never echo what a client sent.
        f"flow {flow.team}/{flow.flow} does not allow the requested model (allowed: {allowed})",
        param="model",
    )


def plan_route(ps: PolicySet, flow: EffectiveFlow, primary: str, judge: EvalJudge) -> Route:
    required = ps.data.classes[flow.data_class].requires_compliance
    entry = ps.providers.models[primary]
    refusal = _refusal(ps, flow, entry, required)
    if refusal is not None:
        raise NotAllowed(
            "model_not_allowed",
            f"model {primary!r} cannot serve flow {flow.team}/{flow.flow}: {refusal}",
            param="model",
        )
    candidates = [Candidate(primary, entry, frozenset())]
    skipped: list[Skip] = []
    seen = {primary}
    for fb in flow.fallback:
        if fb.model in seen:
            continue  # a chain cannot loop: each model is tried at most once
        seen.add(fb.model)
        fb_entry = ps.providers.models[fb.model]
        reason = _refusal(ps, flow, fb_entry, required)
        if reason is None and flow.risk_tier is RiskTier.HIGH:
            verdict = judge(flow, fb.model, fb_entry)
            reason = None if verdict.ok else verdict.reason
        if reason is not None:
            skipped.append(Skip(fb.model, reason))
            continue
        candidates.append(Candidate(fb.model, fb_entry, fb.on_errors))
    return Route(tuple(candidates), tuple(skipped))


def _refusal(ps: PolicySet, flow: EffectiveFlow, entry: ModelEntry, required: frozenset[str]) -> str | None:
    if entry.provider not in flow.allowed_providers:
        return f"provider_not_allowed:{entry.provider}"
    missing = required - ps.providers.providers[entry.provider].compliance
    if missing:
        return "compliance_missing:" + "+".join(sorted(missing))
    return None


def falls_back(error: ErrorClass, next_candidate: Candidate) -> bool:
    return error is not ErrorClass.BAD_REQUEST and error in next_candidate.on_errors
