"""What each role may do. Every admin endpoint and CLI command asks `authorize` first."""

from __future__ import annotations

from enum import StrEnum

from switchyard.policy.keys import Principal
from switchyard.policy.models import Role


class Action(StrEnum):
    CALL_GATEWAY = "call the gateway"
    READ_SPEND = "read spend"
    READ_AUDIT = "read audit records"
    MANAGE_KEYS = "manage keys"
    MANAGE_POLICY = "manage policies"
    OPERATE = "operate the platform"  # up, down, scheduler admin, audit export and purge
    ERASE_SUBJECT = "erase a subject's stored bodies"  # irreversible: platform admins only


class Forbidden(Exception):
    """The principal exists but its role does not allow this action (HTTP 403)."""


# Actions a role may take on its own team's resources...
_OWN_TEAM: dict[Role, frozenset[Action]] = {
    Role.MEMBER: frozenset({Action.CALL_GATEWAY}),
    Role.TEAM_ADMIN: frozenset({Action.CALL_GATEWAY, Action.READ_SPEND, Action.READ_AUDIT, Action.MANAGE_KEYS}),
    Role.AUDITOR: frozenset(),
    Role.PLATFORM_ADMIN: frozenset(Action),
}
# ...and on every team's.
_ANY_TEAM: dict[Role, frozenset[Action]] = {
    Role.MEMBER: frozenset(),
    Role.TEAM_ADMIN: frozenset(),
    Role.AUDITOR: frozenset({Action.READ_AUDIT, Action.READ_SPEND}),
    Role.PLATFORM_ADMIN: frozenset(Action),
}


def allowed(principal: Principal, action: Action, team: str | None = None) -> bool:
    """`team=None` means the action spans all teams (e.g. list every team's spend)."""
    if action in _ANY_TEAM[principal.role]:
        return True
    return team is not None and team == principal.team and action in _OWN_TEAM[principal.role]


def authorize(principal: Principal, action: Action, team: str | None = None) -> None:
    if not allowed(principal, action, team):
        scope = f"team {team!r}" if team is not None else "all teams"
        raise Forbidden(
            f"key {principal.key_id} (role {principal.role.value}, team {principal.team!r}) "
            f"may not {action.value} for {scope}"
        )


def may_create_role(creator: Principal, role: Role, team: str) -> bool:
    """A team admin may issue member and team-admin keys for its own team; only a platform admin more."""
    if creator.role is Role.PLATFORM_ADMIN:
        return True
    return creator.role is Role.TEAM_ADMIN and team == creator.team and role in (Role.MEMBER, Role.TEAM_ADMIN)
