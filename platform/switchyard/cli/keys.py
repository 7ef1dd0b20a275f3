"""`switchyard keys create|list|rotate|revoke`: API keys, shown once, stored as hashes."""

from __future__ import annotations

import argparse
from typing import Any

from switchyard.cli._auth import NotAuthenticated, add_auth_args, principal
from switchyard.cli._output import fail, print_json, print_table
from switchyard.paths import policies_dir
from switchyard.policy.errors import PolicyError
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore, UnknownKeyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden, authorize, may_create_role
from switchyard.state import state_dir


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keys", help="create, list, rotate and revoke API keys")
    sub = parser.add_subparsers(dest="keys_command", required=True)
    create = sub.add_parser("create", help="create a key (printed once)")
    create.add_argument("--team", required=True)
    create.add_argument("--role", default=Role.MEMBER.value, choices=[r.value for r in Role])
    create.add_argument("--note", default="")
    create.set_defaults(handler=run_create)
    lst = sub.add_parser("list", help="list keys (ids and roles; never secrets)")
    lst.add_argument("--team")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.set_defaults(handler=run_list)
    for name, fn in (("rotate", run_rotate), ("revoke", run_revoke)):
        p = sub.add_parser(name, help=f"{name} a key by id")
        p.add_argument("key_id")
        p.add_argument("--team", help="the key's team (checked against the key)")
        p.set_defaults(handler=fn)
    for p in (create, lst, *sub.choices.values()):
        if not any(a.dest == "api_key" for a in p._actions):
            add_auth_args(p)
        if not any(a.dest == "json" for a in p._actions):
            p.add_argument("--json", action="store_true")


def _guarded(fn: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            code: int = fn(args)
        except (NotAuthenticated, Forbidden, UnknownKeyError) as exc:
            return fail(str(exc), 3 if isinstance(exc, NotAuthenticated | Forbidden) else 2)
        return code

    return wrapper


@_guarded
def run_create(args: argparse.Namespace) -> int:
    who = principal(args)
    role = Role(args.role)
    if role in (Role.MEMBER, Role.TEAM_ADMIN):
        try:
            teams = load_policy_set(policies_dir()).teams
        except PolicyError as exc:
            return fail(f"cannot check the team against the policies: {exc}")
        if args.team not in teams:
            return fail(f"unknown team {args.team!r} (teams: {', '.join(sorted(teams))})")
    elif args.team != PLATFORM_TEAM:
        return fail(f"{role.value} keys belong to team {PLATFORM_TEAM!r}, not {args.team!r}")
    if not may_create_role(who, role, args.team):
        raise Forbidden(f"key {who.key_id} (role {who.role.value}) may not create {role.value} keys for {args.team!r}")
    key, record = KeyStore.in_state_dir(state_dir(args.state_dir)).create(args.team, role, args.note)
    if args.json:
        print_json({"key": key, "key_id": record.key_id, "team": record.team, "role": record.role.value})
    else:
        print(f"created key {record.key_id} for team {record.team!r} (role {record.role.value}).")
        print("It is shown only now; store it in your secret manager:")
        print(key)
    return 0


@_guarded
def run_list(args: argparse.Namespace) -> int:
    who = principal(args)
    authorize(who, Action.MANAGE_KEYS, args.team)
    records = KeyStore.in_state_dir(state_dir(args.state_dir)).list(args.team, include_revoked=args.all)
    if args.json:
        print_json([{**r.__dict__, "role": r.role.value} for r in records])
        return 0
    print_table(
        ["key id", "team", "role", "active", "note"],
        [(r.key_id, r.team, r.role.value, "yes" if r.active else "revoked", r.note) for r in records],
    )
    return 0


def _own_key(args: argparse.Namespace, store: KeyStore) -> None:
    record = store.get(args.key_id)
    if record is None:
        raise UnknownKeyError(f"no key with id {args.key_id!r}")
    if args.team is not None and args.team != record.team:
        raise UnknownKeyError(f"key {args.key_id} belongs to team {record.team!r}, not {args.team!r}")
    authorize(principal(args), Action.MANAGE_KEYS, record.team)


@_guarded
def run_rotate(args: argparse.Namespace) -> int:
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    _own_key(args, store)
    key, record = store.rotate(args.key_id)
    if args.json:
        print_json({"key": key, "key_id": record.key_id, "revoked": args.key_id})
    else:
        print(f"revoked {args.key_id}; new key {record.key_id} (shown only now):")
        print(key)
    return 0


@_guarded
def run_revoke(args: argparse.Namespace) -> int:
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    _own_key(args, store)
    record = store.revoke(args.key_id)
    if args.json:
        print_json({"revoked": record.key_id})
    else:
        print(f"revoked key {record.key_id} (team {record.team!r}, role {record.role.value})")
    return 0
