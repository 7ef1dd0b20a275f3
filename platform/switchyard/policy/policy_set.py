"""The validated policy set of one deployment: every file, parsed, with its content hashes."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.policy.models import DataPolicies, OrgPolicy, ProviderCatalog, TeamPolicy
from switchyard.policy.prompts import PromptTemplate


@dataclass(frozen=True)
class PolicySet:
    """Every policy file of one deployment, validated and cross-checked."""

    root: Path
    org: OrgPolicy
    teams: dict[str, TeamPolicy]
    providers: ProviderCatalog
    data: DataPolicies
    prompts: dict[str, PromptTemplate]
    scheduler: dict[str, Any]  # validated by switchyard.scheduler's own schema
    file_hashes: dict[str, str] = field(default_factory=dict)  # relative path -> sha256
    sources: Mapping[str, bytes] = field(default_factory=dict, compare=False, repr=False)
    """Relative path -> the exact bytes parsed (and hashed), for every file, evals/ included:
    what the store keeps as the last good set. Not part of equality or the fingerprint."""

    @property
    def team_names(self) -> set[str]:
        """Every team a key may belong to: the gateway's (`teams/*.yaml`) and the GPU scheduler's
        (`scheduler.yaml`; a research team may only train)."""
        gpu_teams = {str(t["name"]) for t in self.scheduler.get("teams", []) if isinstance(t, dict) and "name" in t}
        return set(self.teams) | gpu_teams

    def team_file(self, team: str) -> str:
        return f"teams/{team}.yaml"

    @property
    def fingerprint(self) -> str:
        joined = "\n".join(f"{k}:{v}" for k, v in sorted(self.file_hashes.items()))
        return hashlib.sha256(joined.encode()).hexdigest()
