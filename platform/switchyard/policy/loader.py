"""Load a policy directory into one validated `PolicySet`, collecting every violation.

A set either loads whole or not at all: `load_policy_set` raises `PolicyError` listing every
problem (parse errors, schema errors, guardrail violations, dangling references), so an
author fixes them in one pass and a running gateway never adopts half a change.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from switchyard.policy.checks import check_policy_set
from switchyard.policy.errors import PolicyError, PolicyViolation
from switchyard.policy.models import DataPolicies, OrgPolicy, ProviderCatalog, TeamPolicy
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.prompts import PromptTemplate
from switchyard.scheduler.core.config import PolicyFileError, parse_policy

M = TypeVar("M", bound=BaseModel)


def policy_files(root: Path) -> list[Path]:
    """Every file that is part of the policy set (what a reload watches)."""
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def hash_files(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in policy_files(root)}


class _Collector:
    """Parses files into models, recording violations instead of stopping at the first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.violations: list[PolicyViolation] = []

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def add(self, file: str, fld: str, message: str) -> None:
        self.violations.append(PolicyViolation(file, fld, message))

    def read_yaml(self, path: Path) -> Any:
        try:
            return yaml.safe_load(path.read_text())
        except FileNotFoundError:
            self.add(self.rel(path), "", "file is missing")
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            where = f"line {mark.line + 1}" if mark is not None else ""
            self.add(self.rel(path), where, f"not valid YAML: {getattr(exc, 'problem', exc)}")
        return None

    def parse(self, path: Path, model: type[M]) -> M | None:
        raw = self.read_yaml(path)
        if raw is None:
            if path.exists() and not self.violations_for(path):
                self.add(self.rel(path), "", "file is empty")
            return None
        try:
            return model.model_validate(raw)
        except ValidationError as exc:
            for err in exc.errors(include_input=False, include_url=False):
                loc = ".".join(str(x) for x in err["loc"])
                self.add(self.rel(path), loc, err["msg"])
            return None

    def violations_for(self, path: Path) -> list[PolicyViolation]:
        return [v for v in self.violations if v.file == self.rel(path)]


def load_policy_set(root: str | Path) -> PolicySet:
    """Load and fully check the policy directory; raise `PolicyError` with every violation."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise PolicyError([PolicyViolation(str(root), "", "policy directory does not exist")])
    c = _Collector(root)
    org = c.parse(root / "org.yaml", OrgPolicy)
    providers = c.parse(root / "providers.yaml", ProviderCatalog)
    data = c.parse(root / "data_policies.yaml", DataPolicies)
    scheduler = c.read_yaml(root / "scheduler.yaml")
    if scheduler is not None:
        try:
            parse_policy(scheduler, "scheduler.yaml")
        except PolicyFileError as exc:
            c.add("scheduler.yaml", "", str(exc).removeprefix("scheduler.yaml: "))
    teams: dict[str, TeamPolicy] = {}
    for path in sorted((root / "teams").glob("*.yaml")):
        team = c.parse(path, TeamPolicy)
        if team is None:
            continue
        if team.team != path.stem:
            c.add(c.rel(path), "team", f"team {team.team!r} must match the file name {path.stem!r}")
        teams[team.team] = team
    prompts: dict[str, PromptTemplate] = {}
    for path in sorted((root / "prompts").glob("*.yaml")):
        prompt = c.parse(path, PromptTemplate)
        if prompt is None:
            continue
        if prompt.id != path.stem:
            c.add(c.rel(path), "id", f"prompt id {prompt.id!r} must match the file name {path.stem!r}")
        prompts[prompt.id] = prompt
    if c.violations or org is None or providers is None or data is None:
        raise PolicyError(c.violations)
    policy_set = PolicySet(
        root=root,
        org=org,
        teams=teams,
        providers=providers,
        data=data,
        prompts=prompts,
        scheduler=scheduler or {},
        file_hashes=hash_files(root),
    )
    violations = check_policy_set(policy_set)
    if violations:
        raise PolicyError(violations)
    return policy_set
