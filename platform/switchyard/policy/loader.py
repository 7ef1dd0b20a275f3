"""Load a policy directory into one validated `PolicySet`, collecting every violation.

A set either loads whole or not at all: `load_policy_set` raises `PolicyError` listing every
problem (unreadable files, parse errors, schema errors, guardrail violations, dangling
references), so an author fixes them in one pass and a running gateway never adopts half a
change. Each file is read once (`switchyard.config_file`); its hash and the bytes kept in
`PolicySet.sources` are of exactly the bytes that were parsed.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from types import MappingProxyType
from typing import Any, TypeVar

from pydantic import BaseModel

from switchyard.config_file import FILE_MISSING, ConfigFileError, Problem, parse_yaml, read_bytes, validate
from switchyard.policy.checks import check_policy_set
from switchyard.policy.errors import PolicyError, PolicyViolation
from switchyard.policy.eval_suites import SUITES_FOLDER, EvalSuite
from switchyard.policy.models import DataPolicies, OrgPolicy, ProviderCatalog, TeamPolicy
from switchyard.policy.policy_set import PolicySet
from switchyard.policy.prompts import PromptTemplate
from switchyard.scheduler.core.config import SchedulerFile

M = TypeVar("M", bound=BaseModel)

REQUIRED_FILES = ("org.yaml", "providers.yaml", "data_policies.yaml", "scheduler.yaml")


def policy_files(root: Path) -> list[Path]:
    """Every file that is part of the policy set (what a reload watches)."""
    return sorted(p for p in root.rglob("*.yaml") if p.is_file())


def hash_files(root: Path) -> dict[str, str]:
    """Hashes of the files as they are now: the store's cheap test for "did anything change"."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in policy_files(root)}


class _Collector:
    """Reads and parses files into models, recording violations instead of stopping at the first."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.violations: list[PolicyViolation] = []
        self.sources: dict[str, bytes] = {}  # relative path -> the bytes read, once

    def rel(self, path: Path) -> str:
        return str(path.relative_to(self.root))

    def add(self, file: str, fld: str, message: str) -> None:
        self.violations.append(PolicyViolation(file, fld, message))

    def add_problems(self, problems: tuple[Problem, ...]) -> None:
        for problem in problems:
            self.add(*problem.parts())

    def read(self, rel: str) -> None:
        try:
            self.sources[rel] = read_bytes(self.root / rel, name=rel)
        except ConfigFileError as exc:
            self.add_problems(exc.problems)

    def parse(self, rel: str, model: type[M]) -> tuple[M, Any] | None:
        """The file's model and its raw data, or None (with violations recorded)."""
        raw = self.sources.get(rel)
        if raw is None:  # unreadable: already a violation
            return None
        try:
            doc = parse_yaml(raw, rel)
            return validate(doc, model), doc.data
        except ConfigFileError as exc:
            self.add_problems(exc.problems)
            return None

    def model(self, rel: str, model: type[M]) -> M | None:
        parsed = self.parse(rel, model)
        return None if parsed is None else parsed[0]


def load_policy_set(root: str | Path) -> PolicySet:
    """Load and fully check the policy directory; raise `PolicyError` with every violation."""
    root = Path(root).resolve()
    if not root.is_dir():
        raise PolicyError([PolicyViolation(str(root), "", "policy directory does not exist")])
    c = _Collector(root)
    listed = [c.rel(p) for p in policy_files(root)]
    for rel in REQUIRED_FILES:
        if rel not in listed:
            c.add(rel, "", FILE_MISSING)
    for rel in listed:  # every file, evals/ included: its hash is part of the set
        c.read(rel)
    org = c.model("org.yaml", OrgPolicy)
    providers = c.model("providers.yaml", ProviderCatalog)
    data = c.model("data_policies.yaml", DataPolicies)
    scheduler = c.parse("scheduler.yaml", SchedulerFile)
    teams: dict[str, TeamPolicy] = {}
    for rel in _in_folder(listed, "teams"):
        team = c.model(rel, TeamPolicy)
        if team is None:
            continue
        if team.team != Path(rel).stem:
            c.add(rel, "team", f"team {team.team!r} must match the file name {Path(rel).stem!r}")
        teams[team.team] = team
    prompts: dict[str, PromptTemplate] = {}
    for rel in _in_folder(listed, "prompts"):
        prompt = c.model(rel, PromptTemplate)
        if prompt is None:
            continue
        if prompt.id != Path(rel).stem:
            c.add(rel, "id", f"prompt id {prompt.id!r} must match the file name {Path(rel).stem!r}")
        prompts[prompt.id] = prompt
    for rel in _in_folder(listed, SUITES_FOLDER):  # parsed to be checked; `eval run` reads them
        c.model(rel, EvalSuite)
    if c.violations or org is None or providers is None or data is None or scheduler is None:
        raise PolicyError(c.violations)
    policy_set = PolicySet(
        root=root,
        org=org,
        teams=teams,
        providers=providers,
        data=data,
        prompts=prompts,
        scheduler=scheduler[1],
        file_hashes={rel: hashlib.sha256(raw).hexdigest() for rel, raw in c.sources.items()},
        sources=MappingProxyType(c.sources),
    )
    violations = check_policy_set(policy_set)
    if violations:
        raise PolicyError(violations)
    return policy_set


def _in_folder(listed: list[str], folder: str) -> list[str]:
    """The listed files directly in `folder` (not in its subfolders)."""
    return [rel for rel in listed if Path(rel).parent == Path(folder)]
