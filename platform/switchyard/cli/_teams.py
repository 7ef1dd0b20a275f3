"""The teams the platform on a state dir serves: for commands that take `--team`, so a typo is
named instead of answering as a team that has done nothing."""

from __future__ import annotations

from pathlib import Path

from switchyard.cluster.record import read_record
from switchyard.paths import policies_dir
from switchyard.policy.errors import PolicyError
from switchyard.policy.loader import load_policy_set


def platform_policies(state: Path) -> Path:
    """The policy directory the platform on this state dir was started with (`up --policies`),
    else the default one: a team exists if the running platform serves it."""
    record = read_record(state)
    return Path(record.policies_dir) if record is not None else policies_dir()


def unknown_team(team: str, state: Path) -> str | None:
    """Why `team` names no team the platform serves, or None when it does or the policies
    cannot be read (a command then answers for it as asked)."""
    try:
        teams = load_policy_set(platform_policies(state)).team_names
    except PolicyError:
        return None
    if team in teams:
        return None
    return f"unknown team {team!r} (teams: {', '.join(sorted(teams))})"
