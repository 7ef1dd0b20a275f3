"""Layering org -> team -> flow, with the file and field that set each effective value.

A flow's effective policy starts from `org.yaml: defaults`, then the team file's team-wide
fields (`allowed_providers`, `retention_days`), then `teams/<t>.yaml: defaults`, then the
flow itself. A field set by a layer replaces the inherited value whole (no deep merge: a
flow that sets `budget` states its whole budget), which keeps "who set this" answerable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from switchyard.policy.errors import PolicyViolation
from switchyard.policy.models import EffectiveFlow, FlowPolicy
from switchyard.policy.policy_set import PolicySet

# Team-wide fields that also act as flow defaults.
TEAM_WIDE_FLOW_FIELDS = ("allowed_providers", "retention_days")


@dataclass(frozen=True)
class Layer:
    """The fields one place in one file sets explicitly."""

    file: str
    prefix: str  # dotted path of this layer inside its file, e.g. "flows.summarise."
    values: dict[str, Any]

    def where(self, field: str) -> str:
        return f"{self.file}: {self.prefix}{field}"


def explicit_fields(policy: FlowPolicy) -> dict[str, Any]:
    return {k: getattr(policy, k) for k in policy.model_fields_set}


def flow_layers(ps: PolicySet, team: str, flow: str) -> list[Layer]:
    """The layers of one flow, most general first."""
    t = ps.teams[team]
    team_file = ps.team_file(team)
    team_wide = {f: getattr(t, f) for f in TEAM_WIDE_FLOW_FIELDS if f in t.model_fields_set}
    return [
        Layer("org.yaml", "defaults.", explicit_fields(ps.org.defaults)),
        Layer(team_file, "", team_wide),
        Layer(team_file, "defaults.", explicit_fields(t.defaults)),
        Layer(team_file, f"flows.{flow}.", explicit_fields(t.flows[flow])),
    ]


@dataclass(frozen=True)
class ResolvedFlow:
    policy: EffectiveFlow
    provenance: dict[str, str]  # field -> "file: dotted.path" of the layer that set it


def resolve_flow(ps: PolicySet, team: str, flow: str) -> ResolvedFlow | list[PolicyViolation]:
    """Merge a flow's layers; on failure, the violations (naming the flow's file)."""
    merged: dict[str, Any] = {}
    provenance = {"team": f"{ps.team_file(team)}: team", "flow": f"{ps.team_file(team)}: flows.{flow}"}
    for layer in flow_layers(ps, team, flow):
        for key, value in layer.values.items():
            merged[key] = value
            provenance[key] = layer.where(key)
    try:
        policy = EffectiveFlow.model_validate({**merged, "team": team, "flow": flow})
    except ValidationError as exc:
        file = ps.team_file(team)
        return [
            PolicyViolation(
                file,
                f"flows.{flow}.{'.'.join(str(x) for x in err['loc'])}",
                "is required and is set neither here, in the team's defaults, nor in org.yaml defaults"
                if err["type"] == "missing"
                else err["msg"],
            )
            for err in exc.errors(include_input=False, include_url=False)
        ]
    return ResolvedFlow(policy, provenance)
