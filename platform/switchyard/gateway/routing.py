"""Which models a request may be answered by, in order, and when to move to the next one.

The chain is the primary (the flow's model, or the one the client asked for among those
the flow allows), then the flow's fallback candidates. A candidate is dropped, with a
reason, when its provider is not allowed for the flow, lacks a compliance tag the flow's
data class requires, or, on a high-risk flow, has no valid eval record for this flow.
A candidate, the primary included, is also skipped when it lacks a capability the request
needs (tools, images, its context window; see `capabilities.py`): those skips depend on the
request, so they are named in `x-switchyard-fallback` as `model:reason`. When no candidate
is left the request is refused (400) naming what it needs and why each model cannot serve it.
A failure moves on only when the next candidate's rule lists its error class.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from switchyard.gateway.capabilities import Needs, lacking
from switchyard.gateway.errors import BadRequest, NotAllowed
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
    capability: bool = False  # skipped for what this request needs, not for the flow's policy


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


def plan_route(
    ps: PolicySet,
    flow: EffectiveFlow,
    primary: str,
    judge: EvalJudge,
    needs: Needs = Needs(),
    input_tokens: Callable[[ModelEntry], int | None] | None = None,
) -> Route:
    """`input_tokens(entry)`: the request's input in `entry`'s tokenizer where it is counted
    exactly, checked against the context window; None where only an upper bound is known (a
    bound must not skip a model the request fits)."""
    required = ps.data.classes[flow.data_class].requires_compliance
    entry = ps.providers.models[primary]
    refusal = _refusal(ps, flow, entry, required)
    if refusal is not None:
        raise NotAllowed(
            "model_not_allowed",
            f"model {primary!r} cannot serve flow {flow.team}/{flow.flow}: {refusal}",
            param="model",
        )
    candidates: list[Candidate] = []
    skipped: list[Skip] = []

    def consider(model: str, model_entry: ModelEntry, on_errors: frozenset[ErrorClass]) -> None:
        missing = lacking(model_entry, needs, input_tokens(model_entry) if input_tokens is not None else None)
        if missing is not None:
            skipped.append(Skip(model, missing, capability=True))
        else:
            # The first capable candidate opens the chain whatever rule led to it.
            candidates.append(Candidate(model, model_entry, on_errors if candidates else frozenset()))

    consider(primary, entry, frozenset())
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
        consider(fb.model, fb_entry, fb.on_errors)
    if not candidates:
        why = "; ".join(f"{s.model}: {s.reason}" for s in skipped)
        raise BadRequest(
            "unsupported_feature",
            f"no model of flow {flow.team}/{flow.flow} can serve a request with {needs.described()} ({why})",
            param=_feature_param(needs),
        )
    return Route(tuple(candidates), tuple(skipped))


def _feature_param(needs: Needs) -> str:
    if needs.tools:
        return "tools"
    if needs.images:
        return "messages"
    if needs.sampling:
        return min(needs.sampling)
    return "model"


def _refusal(ps: PolicySet, flow: EffectiveFlow, entry: ModelEntry, required: frozenset[str]) -> str | None:
    if entry.provider not in flow.allowed_providers:
        return f"provider_not_allowed:{entry.provider}"
    missing = required - ps.providers.providers[entry.provider].compliance
    if missing:
        return "compliance_missing:" + "+".join(sorted(missing))
    return None


def falls_back(error: ErrorClass, next_candidate: Candidate) -> bool:
    return error is not ErrorClass.BAD_REQUEST and error in next_candidate.on_errors
