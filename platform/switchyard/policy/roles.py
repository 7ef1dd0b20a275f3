"""What each role may do. Every admin endpoint and CLI command asks `authorize` first."""

from __future__ import annotations

from enum import StrEnum

from switchyard.policy.keys import PLATFORM_TEAM, KeyRecord, Principal
from switchyard.policy.models import Role


class Action(StrEnum):
    CALL_GATEWAY = "call the gateway"
    READ_SPEND = "read spend"
    # A team's aggregates without money or bodies: request rates and errors, provider circuits,
    # its training queue and runs. What a member (a researcher) needs to follow its own work.
    VIEW_TEAM = "view the team's traffic and jobs"
    READ_AUDIT = "read audit records"
    MANAGE_KEYS = "manage keys"
    MANAGE_POLICY = "manage policies"
    OPERATE = "operate the platform"  # up, down, scheduler admin, audit export and purge
    ERASE_SUBJECT = "erase a subject's stored bodies"  # irreversible: platform admins only


class Forbidden(Exception):
    """The principal exists but its role does not allow this action (HTTP 403).

    `public` is the message for an HTTP answer: it names no value the client sent."""

    def __init__(self, message: str, public: str | None = None) -> None:
        super().__init__(message)
        self.public = public or message


# Actions a role may take on its own team's resources...
_OWN_TEAM: dict[Role, frozenset[Action]] = {
    Role.MEMBER: frozenset({Action.CALL_GATEWAY, Action.VIEW_TEAM}),
    Role.TEAM_ADMIN: frozenset(
        {Action.CALL_GATEWAY, Action.VIEW_TEAM, Action.READ_SPEND, Action.READ_AUDIT, Action.MANAGE_KEYS}
    ),
    Role.AUDITOR: frozenset(),
    Role.PLATFORM_ADMIN: frozenset(Action),
}
# ...and on every team's.
_ANY_TEAM: dict[Role, frozenset[Action]] = {
    Role.MEMBER: frozenset(),
    Role.TEAM_ADMIN: frozenset(),
    Role.AUDITOR: frozenset({Action.READ_AUDIT, Action.READ_SPEND, Action.VIEW_TEAM}),
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
        who = f"key {principal.key_id} (role {principal.role.value}, team {principal.team!r}) may not {action.value}"
        # Over HTTP the team is not repeated: it may be whatever a client typed in a query.
        over_http = "all teams" if team is None else "its own team" if team == principal.team else "another team"
        raise Forbidden(f"{who} for {scope}", public=f"{who} for {over_http}")


# Keys a team admin may create, rotate and revoke (for its own team). Auditor and
# platform-admin keys are the platform's: only a platform admin manages them, whatever team
# the caller's key names.
_TEAM_MANAGED_ROLES = frozenset({Role.MEMBER, Role.TEAM_ADMIN})


def may_create_role(creator: Principal, role: Role, team: str) -> bool:
    """A team admin may issue member and team-admin keys for its own team; only a platform admin more."""
    if creator.role is Role.PLATFORM_ADMIN:
        return True
    return (
        creator.role is Role.TEAM_ADMIN
        and team == creator.team
        and team != PLATFORM_TEAM
        and role in _TEAM_MANAGED_ROLES
    )


def may_manage_key(manager: Principal, record: KeyRecord) -> bool:
    """Whether `manager` may rotate or revoke the key `record` describes.

    Decided by the target key's role as well as its team: rotating hands out a new key of the
    same role, so managing a key is creating one of its role (`may_create_role`)."""
    return may_create_role(manager, record.role, record.team)


def authorize_key_change(manager: Principal, record: KeyRecord, verb: str) -> None:
    if not may_manage_key(manager, record):
        raise Forbidden(
            f"key {manager.key_id} (role {manager.role.value}, team {manager.team!r}) may not manage "
            f"{record.role.value} key {record.key_id} of team {record.team!r}: only a platform admin may "
            f"{verb} auditor and platform-admin keys; a team admin, its own team's member and team-admin keys"
        )
