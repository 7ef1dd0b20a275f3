"""Errors a policy author can cause, each naming the file, the field and the reason."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class PolicyViolation:
    """One problem in the policy set: where it is and what is wrong."""

    file: str
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}: {self.field}" if self.field else self.file
        return f"{where}: {self.message}"


class PolicyError(Exception):
    """A policy set that cannot take effect. Carries every violation found, not just the first."""

    def __init__(self, violations: list[PolicyViolation]) -> None:
        self.violations = violations
        lines = "\n".join(f"  - {v}" for v in violations)
        super().__init__(f"{len(violations)} policy violation(s):\n{lines}")


def relative(path: Path, root: Path) -> str:
    try:
        return str(path.relative_to(root.parent)) if path.is_relative_to(root.parent) else str(path)
    except ValueError:
        return str(path)
