"""Who is running a CLI command: the key in --api-key, $SWITCHYARD_API_KEY, or the operator's
admin key that `switchyard up` wrote to the state directory (mode 0600, like a kubeconfig)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from switchyard.policy.keys import PLATFORM_TEAM, KeyStore, Principal
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, authorize
from switchyard.state import state_dir

API_KEY_ENV = "SWITCHYARD_API_KEY"
ADMIN_KEY_FILE = "admin.key"


class NotAuthenticated(Exception):
    pass


def add_auth_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--api-key", help=f"key to act as (default: ${API_KEY_ENV}, then the state dir's admin key)")
    parser.add_argument("--state-dir", help="platform state directory (default: $SWITCHYARD_STATE_DIR or .switchyard)")


def ensure_admin_key(state: Path) -> str | None:
    """Create the operator's platform-admin key on first start, or when the file holds no key
    that verifies (revoked, expired, or damaged: it is only a copy). Returns it only when new."""
    path = state / ADMIN_KEY_FILE
    with KeyStore.in_state_dir(state) as store:
        try:
            kept = _key_in(path)
        except NotAuthenticated:
            kept = None  # not UTF-8: no key to keep; a new one replaces the file
        if kept is not None and store.verify(kept) is not None:
            return None
        key, _ = store.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN, note="operator key written by `switchyard up`")
    path.touch(mode=0o600)
    path.write_text(key + "\n")
    return key


def operator_key(state: Path, given: str | None) -> str | None:
    """The key a command acts with: `given`, else $SWITCHYARD_API_KEY, else the admin key file."""
    key = given or os.environ.get(API_KEY_ENV)
    return key or _key_in(state / ADMIN_KEY_FILE)


def _key_in(path: Path) -> str | None:
    """The key an admin key file holds; None when there is no file (or it is empty)."""
    try:
        return path.read_bytes().decode("utf-8").strip() or None
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise NotAuthenticated(
            f"{path} holds no key (it is not UTF-8 text): pass --api-key, or run `switchyard up` to write a new one"
        ) from None
    except OSError as exc:
        raise NotAuthenticated(f"{path} cannot be read: {exc.strerror}") from None


def principal(args: argparse.Namespace) -> Principal:
    state = state_dir(args.state_dir)
    key = operator_key(state, args.api_key)
    if not key:
        raise NotAuthenticated(f"no key: pass --api-key or set ${API_KEY_ENV}")
    with KeyStore.in_state_dir(state) as store:
        found = store.verify(key)
    if found is None:
        raise NotAuthenticated("the key is unknown, revoked or expired")
    return found


def require(args: argparse.Namespace, action: Action, team: str | None = None) -> Principal:
    who = principal(args)
    authorize(who, action, team)
    return who
