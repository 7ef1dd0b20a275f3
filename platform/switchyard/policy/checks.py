"""Every rule a policy set must satisfy beyond its schema: guardrails and references.

Guardrails (org.yaml `guardrails`) say how far a team may move a field: `locked` fields may
not be set by a team at all; bounded ones may only be tightened (a lower budget, a shorter
retention, a higher data class, fewer providers). They are checked on every team-wide field
and on every layer of every flow, and a violation names the file, the field, the team's value
and the org rule. A `min` is a floor for the same fields: `eval.threshold: {min: 0.9}` stops a
team from passing its own high-risk fallbacks with a lax eval gate.

The team name `platform` is reserved: auditor and platform-admin keys belong to it, and a team
admin of a policy team by that name would share a team with the operator's keys.

Money: every model a flow can reach (its `model`, `allowed_models` and fallbacks) must have a
price effective on the day of the check (`providers.yaml: models.<m>.prices`); without one a
call would have no cost. A budget limit written as `null` is a violation: left out, it is
inherited (a team's from the guardrail's `max`, a flow's from its team), and `null` reads as
"no limit", which no layer may grant.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, date, datetime
from typing import Any

from pydantic import BaseModel

from switchyard.policy.errors import PolicyViolation
from switchyard.policy.eval_suites import SUITES_FOLDER
from switchyard.policy.keys import PLATFORM_TEAM
from switchyard.policy.layering import Layer, ResolvedFlow, explicit_fields, flow_layers, resolve_flow
from switchyard.policy.models import MAX_DEADLINE_MS, Bound, BudgetLimits, EffectiveFlow, Priority
from switchyard.policy.policy_set import PolicySet


def check_policy_set(ps: PolicySet, today: date | None = None) -> list[PolicyViolation]:
    """Every violation; prices are checked for `today` (default: the current UTC day)."""
    day = datetime.now(UTC).date() if today is None else today
    violations: list[PolicyViolation] = []
    violations += _check_prompts(ps)
    violations += _check_catalog(ps)
    violations += _check_admission(ps)
    violations += _check_budget_nulls(ps)
    violations += _check_guardrail_classes(ps)
    violations += _check_deadlines(ps)
    unpriced: dict[str, list[str]] = {}  # model -> where a flow reaches it
    for team_name, team in ps.teams.items():
        if team_name == PLATFORM_TEAM:
            violations.append(
                PolicyViolation(
                    ps.team_file(team_name),
                    "team",
                    f"the team name {PLATFORM_TEAM!r} is reserved for the platform's own auditor and "
                    "platform-admin keys; give the team another name",
                )
            )
        violations += _check_guardrails(ps, _team_layers(ps, team_name))
        if team.default_flow is not None and team.default_flow not in team.flows:
            violations.append(
                PolicyViolation(
                    ps.team_file(team_name),
                    "default_flow",
                    f"names flow {team.default_flow!r}, which the team does not define "
                    f"(flows: {', '.join(sorted(team.flows)) or 'none'})",
                )
            )
        for flow_name in team.flows:
            violations += _check_guardrails(ps, flow_layers(ps, team_name, flow_name)[1:])
            resolved = resolve_flow(ps, team_name, flow_name)
            if isinstance(resolved, list):
                violations += resolved
            else:
                violations += _check_flow_references(ps, resolved)
                violations += _check_priority(ps, resolved)
                for model, where in _unpriced_models(ps, resolved, day):
                    unpriced.setdefault(model, []).append(where)
    violations += [_no_price(ps, model, day, unpriced[model]) for model in sorted(unpriced)]
    return violations


# ---------------------------------------------------------------- deadlines


def _check_deadlines(ps: PolicySet) -> list[PolicyViolation]:
    """No layer may set a deadline past `MAX_DEADLINE_MS`, the org's defaults included (no
    guardrail covers them). Before stop 48 `policy check` passed such a set and a running
    gateway reloaded it, though no replica could start on it: a budget hold could expire, and
    an idempotency claim lapse, while one of its requests still ran."""
    layers = [Layer("org.yaml", "defaults.", explicit_fields(ps.org.defaults))]
    for team_name, team in ps.teams.items():
        file = ps.team_file(team_name)
        layers.append(Layer(file, "defaults.", explicit_fields(team.defaults)))
        layers += [Layer(file, f"flows.{name}.", explicit_fields(flow)) for name, flow in team.flows.items()]
    return [
        PolicyViolation(
            layer.file,
            f"{layer.prefix}deadline_ms",
            f"{deadline} ms is longer than any request may run ({MAX_DEADLINE_MS} ms): the gateway's budget "
            "holds and idempotency claims are sized to outlive every request, so a longer one could be "
            "charged past its team's budget, or run twice when its client retries",
        )
        for layer in layers
        if (deadline := layer.values.get("deadline_ms")) is not None and deadline > MAX_DEADLINE_MS
    ]


# ---------------------------------------------------------------- guardrails


def _team_layers(ps: PolicySet, team: str) -> list[Layer]:
    t = ps.teams[team]
    fields = ("budget", "rate_limit")
    return [Layer(ps.team_file(team), "", {f: getattr(t, f) for f in fields if f in t.model_fields_set})]


def _lookup(values: dict[str, Any], path: str) -> Any:
    head, _, rest = path.partition(".")
    if head not in values:
        return None
    value = values[head]
    for part in rest.split(".") if rest else ():
        value = getattr(value, part, None)
        if value is None:
            return None
    return value


def _check_guardrails(ps: PolicySet, layers: list[Layer]) -> list[PolicyViolation]:
    out: list[PolicyViolation] = []
    for layer in layers:
        for path, bound in ps.org.guardrails.items():
            value = _lookup(layer.values, path)
            if value is None:
                continue
            problem = _violates(ps, bound, value)
            if problem is not None:
                out.append(PolicyViolation(layer.file, f"{layer.prefix}{path}", problem))
    return out


def _check_guardrail_classes(ps: PolicySet) -> list[PolicyViolation]:
    """A guardrail's `min_class` must be a data class of data_policies.yaml: the checks of every
    team's data classes against it rank both (a class deleted there raised KeyError, stop 44)."""
    known = ", ".join(sorted(ps.data.classes))
    return [
        PolicyViolation(
            "org.yaml", f"guardrails.{path}.min_class", f"unknown data class {bound.min_class!r} (known: {known})"
        )
        for path, bound in ps.org.guardrails.items()
        if bound.min_class is not None and bound.min_class not in ps.data.classes
    ]


def _violates(ps: PolicySet, bound: Bound, value: Any) -> str | None:
    if bound.locked:
        return f"is locked by org.yaml guardrails; the team sets {value!r}"
    numeric = isinstance(value, int | float) and not isinstance(value, bool)
    if bound.max is not None and numeric and value > bound.max:
        return f"the team sets {value}, above the org cap of {bound.max} (org.yaml guardrails: max)"
    if bound.min is not None and numeric and value < bound.min:
        return f"the team sets {value}, below the org floor of {bound.min} (org.yaml guardrails: min)"
    if bound.min_class is not None and isinstance(value, str):
        if value not in ps.data.classes:
            return f"unknown data class {value!r} (known: {', '.join(sorted(ps.data.classes))})"
        if bound.min_class in ps.data.classes and ps.data.rank(value) < ps.data.rank(bound.min_class):
            return (
                f"the team sets data class {value!r}, below the org floor {bound.min_class!r} "
                "(org.yaml guardrails: min_class; a team may raise a data class, never lower it)"
            )
    if bound.subset_of is not None and isinstance(value, frozenset):
        extra = value - bound.subset_of
        if extra:
            return (
                f"the team allows {sorted(extra)}, outside the org's set {sorted(bound.subset_of)} "
                "(org.yaml guardrails: subset_of)"
            )
    return None


# ---------------------------------------------------------------- references


def _check_prompts(ps: PolicySet) -> list[PolicyViolation]:
    out: list[PolicyViolation] = []
    for prompt in ps.prompts.values():
        file = f"prompts/{prompt.id}.yaml"
        for n, version in enumerate(prompt.versions):
            actual = version.content_hash()
            if version.sha256 is None:
                out.append(
                    PolicyViolation(
                        file,
                        f"versions.{n}.sha256",
                        f"version {version.version} is not published; to publish it, record sha256: {actual}",
                    )
                )
            elif version.sha256 != actual:
                out.append(
                    PolicyViolation(
                        file,
                        f"versions.{n}",
                        f"version {version.version} was edited after publication (recorded "
                        f"sha256 {version.sha256[:12]}..., content now {actual[:12]}...); "
                        "published versions are immutable: add a new version instead",
                    )
                )
    return out


def _check_catalog(ps: PolicySet) -> list[PolicyViolation]:
    out: list[PolicyViolation] = []
    for cls_name, cls in ps.data.classes.items():
        for tag in cls.requires_compliance:
            if not any(tag in p.compliance for p in ps.providers.providers.values()):
                out.append(
                    PolicyViolation(
                        "data_policies.yaml",
                        f"classes.{cls_name}.requires_compliance",
                        f"no provider carries compliance tag {tag!r}",
                    )
                )
    return out


def _check_admission(ps: PolicySet) -> list[PolicyViolation]:
    adm = ps.org.gateway.admission
    out: list[PolicyViolation] = []
    for provider in sorted(adm.provider_max_in_flight):
        if provider not in ps.providers.providers:
            out.append(
                PolicyViolation(
                    "org.yaml",
                    f"gateway.admission.provider_max_in_flight.{provider}",
                    f"unknown provider {provider!r} (known: {', '.join(sorted(ps.providers.providers))})",
                )
            )
    for team in sorted(adm.urgent_teams or ()):
        if team not in ps.teams:
            out.append(
                PolicyViolation(
                    "org.yaml",
                    "gateway.admission.urgent_teams",
                    f"unknown team {team!r} (no teams/{team}.yaml)",
                )
            )
    return out


def _check_priority(ps: PolicySet, resolved: ResolvedFlow) -> list[PolicyViolation]:
    """Urgent flows are shed last, so the org names who may have them (`urgent_teams`)."""
    flow = resolved.policy
    allowed = ps.org.gateway.admission.urgent_teams
    if flow.priority is not Priority.URGENT or allowed is None or flow.team in allowed:
        return []
    file, _, path = resolved.provenance.get(
        "priority", f"{ps.team_file(flow.team)}: flows.{flow.flow}.priority"
    ).partition(": ")
    return [
        PolicyViolation(
            file,
            path,
            f"flow {flow.team}/{flow.flow} is urgent, but org.yaml gateway.admission.urgent_teams "
            f"({', '.join(sorted(allowed)) or 'none'}) does not include team {flow.team!r}",
        )
    ]


def _flow_models(flow: EffectiveFlow) -> Iterator[tuple[str, str]]:
    yield "model", flow.model
    for m in sorted(flow.allowed_models):
        yield "allowed_models", m
    for i, cand in enumerate(flow.fallback):
        yield f"fallback.{i}.model", cand.model


def _where(ps: PolicySet, resolved: ResolvedFlow, field: str) -> str:
    """`file: dotted.path` of the layer that set `field` (e.g. `fallback.0.model`) of a flow."""
    flow = resolved.policy
    top, _, tail = field.partition(".")
    where = resolved.provenance.get(top, f"{ps.team_file(flow.team)}: flows.{flow.flow}.{top}")
    return f"{where}.{tail}" if tail else where


def _unpriced_models(ps: PolicySet, resolved: ResolvedFlow, day: date) -> Iterator[tuple[str, str]]:
    for field, model in _flow_models(resolved.policy):
        entry = ps.providers.models.get(model)
        if entry is not None and entry.price_on(day) is None:  # an unknown model is reported already
            yield model, _where(ps, resolved, field)


def _no_price(ps: PolicySet, model: str, day: date, reached_from: list[str]) -> PolicyViolation:
    prices = ps.providers.models[model].prices
    first = f"the first is effective {prices[0].effective.isoformat()}" if prices else "it has none"
    return PolicyViolation(
        "providers.yaml",
        f"models.{model}.prices",
        f"no price effective on {day.isoformat()} ({first}), and flows can reach the model "
        f"({'; '.join(sorted(set(reached_from)))}): a call would have no cost. Add a price effective "
        "on or before today (zero is allowed, written down)",
    )


def _budget_layers(ps: PolicySet) -> Iterator[tuple[str, str, BaseModel]]:
    """(file, dotted path of its parent, parent) of every place a `budget` may be written."""
    yield "org.yaml", "", ps.org
    yield "org.yaml", "defaults.", ps.org.defaults
    for name, team in ps.teams.items():
        file = ps.team_file(name)
        yield file, "", team
        yield file, "defaults.", team.defaults
        for flow_name, flow in team.flows.items():
            yield file, f"flows.{flow_name}.", flow


def _check_budget_nulls(ps: PolicySet) -> list[PolicyViolation]:
    """`budget: null` or `day_usd: null` reads as "no limit"; a left-out limit is inherited."""
    out: list[PolicyViolation] = []
    hint = (
        "give a limit in USD, or leave the field out to inherit one "
        "(a team's is the org.yaml guardrail's max, a flow's its team's)"
    )
    for file, prefix, parent in _budget_layers(ps):
        budget = getattr(parent, "budget", None)
        if "budget" in parent.model_fields_set and budget is None:
            out.append(PolicyViolation(file, f"{prefix}budget", f"is null; {hint}"))
        if not isinstance(budget, BudgetLimits):
            continue
        for field in ("day_usd", "month_usd"):
            if field in budget.model_fields_set and getattr(budget, field) is None:
                out.append(PolicyViolation(file, f"{prefix}budget.{field}", f"is null; {hint}"))
    return out


def _check_flow_references(ps: PolicySet, resolved: ResolvedFlow) -> list[PolicyViolation]:
    flow = resolved.policy
    out: list[PolicyViolation] = []

    def bad(field: str, message: str) -> None:
        file, _, path = _where(ps, resolved, field).partition(": ")
        out.append(PolicyViolation(file, path, message))

    prompt = ps.prompts.get(flow.prompt_id) if "@" in flow.prompt else None
    if "@" not in flow.prompt or not flow.prompt.split("@", 1)[1].isdigit():
        bad("prompt", f"{flow.prompt!r} must be '<prompt-id>@<version>'")
    elif prompt is None:
        bad("prompt", f"unknown prompt {flow.prompt_id!r} (no prompts/{flow.prompt_id}.yaml)")
    else:
        for version in {flow.prompt_version, *flow.allowed_prompt_versions}:
            if prompt.get(version) is None:
                bad("prompt", f"prompt {flow.prompt_id!r} has no version {version}")
    if flow.data_class not in ps.data.classes:
        bad("data_class", f"unknown data class {flow.data_class!r}")
        return out
    required = ps.data.classes[flow.data_class].requires_compliance
    for provider in sorted(flow.allowed_providers):
        if provider not in ps.providers.providers:
            bad("allowed_providers", f"unknown provider {provider!r}")
    for field, model in _flow_models(flow):
        entry = ps.providers.models.get(model)
        if entry is None:
            bad(field, f"unknown model {model!r} (not in providers.yaml models)")
            continue
        if entry.provider not in flow.allowed_providers:
            bad(field, f"model {model!r} is served by {entry.provider!r}, which this flow does not allow")
        missing = required - ps.providers.providers[entry.provider].compliance
        if missing and field == "model":
            bad(
                field,
                f"data class {flow.data_class!r} requires compliance {sorted(required)}; "
                f"provider {entry.provider!r} lacks {sorted(missing)}",
            )
    if flow.risk_tier == "high" and flow.fallback and flow.eval is None:
        bad("fallback", "a high-risk flow with a fallback chain needs an `eval` gate (suite, threshold)")
    if flow.eval is not None and f"{SUITES_FOLDER}/{flow.eval.suite}" not in ps.file_hashes:
        bad("eval", f"unknown eval suite {flow.eval.suite!r} (no {SUITES_FOLDER}/{flow.eval.suite})")
    return out
