"""`switchyard keys create|list|rotate|revoke|events`: API keys, shown once, stored as hashes.

Every create, rotate and revoke is recorded in the key-event chain in `keys.db`
(`switchyard keys events` lists it and checks the chain)."""

from __future__ import annotations

import argparse
import re
import time
from datetime import UTC, datetime
from typing import Any

from switchyard.cli._auth import NotAuthenticated, add_auth_args, principal
from switchyard.cli._output import fail, print_json, print_table
from switchyard.cli._teams import platform_policies
from switchyard.policy.errors import PolicyError
from switchyard.policy.keys import LATEST_EXPIRY, PLATFORM_TEAM, KeyRecord, KeyStore, UnknownKeyError
from switchyard.policy.loader import load_policy_set
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden, authorize, authorize_key_change, may_create_role
from switchyard.state import state_dir

EXPIRES_HELP = "when the key stops working: an age (90m, 12h, 30d, 8w), a date (2027-01-31, 00:00 UTC) or an ISO time"
_AGE = re.compile(r"(\d{1,12})([mhdw])")
_AGE_UNITS = {"m": 60, "h": 3600, "d": 86_400, "w": 7 * 86_400}


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("keys", help="create, list, rotate and revoke API keys")
    sub = parser.add_subparsers(dest="keys_command", required=True)
    create = sub.add_parser("create", help="create a key (printed once)")
    create.add_argument("--team", required=True)
    create.add_argument("--role", default=Role.MEMBER.value, choices=[r.value for r in Role])
    create.add_argument("--note", default="")
    create.add_argument("--expires", help=EXPIRES_HELP + " (default: never)")
    create.set_defaults(handler=run_create)
    lst = sub.add_parser("list", help="list keys (ids, roles and expiry; never secrets)")
    lst.add_argument("--team")
    lst.add_argument("--all", action="store_true", help="include revoked keys")
    lst.set_defaults(handler=run_list)
    for name, fn in (("rotate", run_rotate), ("revoke", run_revoke)):
        p = sub.add_parser(name, help=f"{name} a key by id")
        p.add_argument("key_id")
        p.add_argument("--team", help="the key's team (checked against the key)")
        p.set_defaults(handler=fn)
    sub.choices["rotate"].add_argument(
        "--expires", help=EXPIRES_HELP + " (default: the new key never expires; the old key's expiry is not kept)"
    )
    events = sub.add_parser("events", help="who created, rotated and revoked which key; checks the event chain")
    events.add_argument("--team", help="the keys' team (omit for all teams: auditors and platform admins)")
    events.set_defaults(handler=run_events)
    for p in sub.choices.values():
        if not any(a.dest == "api_key" for a in p._actions):
            add_auth_args(p)
        if not any(a.dest == "json" for a in p._actions):
            p.add_argument("--json", action="store_true")


def parse_expiry(text: str, now: float) -> float:
    """`--expires`: an age from now, a date (its 00:00 UTC) or an ISO time (UTC if no zone); in the future."""
    text = text.strip()
    age = _AGE.fullmatch(text)
    if age is not None:
        when = now + int(age[1]) * _AGE_UNITS[age[2]]
    else:
        try:
            parsed = datetime.fromisoformat(text)
        except ValueError:
            raise ValueError(f"--expires: {text!r} is not an age (30d), a date (2027-01-31) or an ISO time") from None
        when = (parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)).timestamp()
    if when <= now:
        raise ValueError(f"--expires: {text!r} is not in the future")
    if when > LATEST_EXPIRY:
        raise ValueError(f"--expires: {text!r} is past 9999-12-31 (leave --expires out for a key that never expires)")
    return when


def _when(ts: float | None) -> str:
    if ts is None:
        return "never"
    try:
        return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    except (OverflowError, OSError, ValueError):  # stored before expiries were bounded
        return f"{ts:.0f} (unix seconds)"


def _guarded(fn: Any) -> Any:
    def wrapper(args: argparse.Namespace) -> int:
        try:
            code: int = fn(args)
        except (NotAuthenticated, Forbidden) as exc:
            return fail(str(exc), 3)
        except (UnknownKeyError, ValueError) as exc:
            return fail(str(exc), 2)
        return code

    return wrapper


def _expiry(args: argparse.Namespace) -> float | None:
    return None if args.expires is None else parse_expiry(args.expires, time.time())


@_guarded
def run_create(args: argparse.Namespace) -> int:
    who = principal(args)
    role = Role(args.role)
    expires_at = _expiry(args)
    if role in (Role.MEMBER, Role.TEAM_ADMIN):
        if args.team == PLATFORM_TEAM:
            return fail(f"team {PLATFORM_TEAM!r} is reserved for auditor and platform-admin keys")
        try:
            teams = load_policy_set(platform_policies(state_dir(args.state_dir))).team_names
        except PolicyError as exc:
            return fail(f"cannot check the team against the policies: {exc}")
        if args.team not in teams:
            return fail(f"unknown team {args.team!r} (teams: {', '.join(sorted(teams))})")
    elif args.team != PLATFORM_TEAM:
        return fail(f"{role.value} keys belong to team {PLATFORM_TEAM!r}, not {args.team!r}")
    if not may_create_role(who, role, args.team):
        raise Forbidden(f"key {who.key_id} (role {who.role.value}) may not create {role.value} keys for {args.team!r}")
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    key, record = store.create(args.team, role, args.note, expires_at=expires_at, by=who)
    if args.json:
        print_json(
            {
                "key": key,
                "key_id": record.key_id,
                "team": record.team,
                "role": record.role.value,
                "expires_at": record.expires_at,
            }
        )
    else:
        print(
            f"created key {record.key_id} for team {record.team!r} (role {record.role.value}, "
            f"expires {_when(record.expires_at)})."
        )
        print("It is shown only now; store it in your secret manager:")
        print(key)
    return 0


def _status(record: KeyRecord, now: float) -> str:
    if not record.active:
        return "revoked"
    return "expired" if record.expired(now) else "yes"


@_guarded
def run_list(args: argparse.Namespace) -> int:
    who = principal(args)
    authorize(who, Action.MANAGE_KEYS, args.team)
    records = KeyStore.in_state_dir(state_dir(args.state_dir)).list(args.team, include_revoked=args.all)
    now = time.time()
    if args.json:
        print_json([{**r.__dict__, "role": r.role.value, "expired": r.expired(now)} for r in records])
        return 0
    print_table(
        ["key id", "team", "role", "active", "expires", "note"],
        [(r.key_id, r.team, r.role.value, _status(r, now), _when(r.expires_at), r.note) for r in records],
    )
    return 0


def _target(args: argparse.Namespace, store: KeyStore) -> KeyRecord:
    record = store.get(args.key_id)
    if record is None:
        raise UnknownKeyError(f"no key with id {args.key_id!r}")
    if args.team is not None and args.team != record.team:
        raise UnknownKeyError(f"key {args.key_id} belongs to team {record.team!r}, not {args.team!r}")
    return record


@_guarded
def run_rotate(args: argparse.Namespace) -> int:
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    who = principal(args)
    old = _target(args, store)
    authorize_key_change(who, old, "rotate")
    key, record = store.rotate(args.key_id, expires_at=_expiry(args), by=who)
    if args.json:
        print_json({"key": key, "key_id": record.key_id, "revoked": args.key_id, "expires_at": record.expires_at})
        return 0
    print(f"revoked {args.key_id}; new key {record.key_id}, expires {_when(record.expires_at)} (shown only now):")
    print(key)
    if old.expires_at is not None and record.expires_at is None:
        print(f"note: {args.key_id} had an expiry; the new key has none (pass --expires to set one)")
    return 0


@_guarded
def run_revoke(args: argparse.Namespace) -> int:
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    who = principal(args)
    authorize_key_change(who, _target(args, store), "revoke")
    record = store.revoke(args.key_id, by=who)
    if args.json:
        print_json({"revoked": record.key_id})
    else:
        print(f"revoked key {record.key_id} (team {record.team!r}, role {record.role.value})")
    return 0


@_guarded
def run_events(args: argparse.Namespace) -> int:
    authorize(principal(args), Action.READ_AUDIT, args.team)
    store = KeyStore.in_state_dir(state_dir(args.state_dir))
    events, findings = store.events(args.team), store.verify_events()
    if args.json:
        print_json(
            {
                "ok": not findings,
                "events": [e.__dict__ for e in events],
                "findings": [{"seq": f.seq, "problem": f.problem, "detail": f.detail} for f in findings],
            }
        )
    else:
        print_table(
            ["seq", "time", "action", "key id", "team", "role", "new key", "expires", "by"],
            [
                (
                    e.seq,
                    _when(e.time),
                    e.action,
                    e.key_id,
                    e.team,
                    e.role.value,
                    e.new_key_id or "",
                    _when(e.expires_at) if e.action != "revoke" else "",
                    f"{e.by_key_id} ({e.by_role.value})" if e.by_key_id and e.by_role else "switchyard up",
                )
                for e in events
            ],
        )
        for f in findings:
            print(f"BROKEN {f}")
    return 1 if findings else 0
