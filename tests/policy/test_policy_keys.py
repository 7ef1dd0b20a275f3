"""Keys are shown once, stored as hashes, and every role can do exactly what it should."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from switchyard.cli import main
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden, allowed, authorize


def test_only_the_hash_is_stored(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, _record = store.create("support", Role.MEMBER)
    raw = (tmp_path / "keys.db").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("keys.db-*"))
    assert key.split("_", 2)[2].encode() not in raw
    assert store.verify(key) is not None and store.verify(key).team == "support"  # type: ignore[union-attr]
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.verify("not-a-key") is None
    assert (tmp_path / "keys.db").stat().st_mode & 0o077 == 0


def test_rotate_and_revoke(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, record = store.create("ads", Role.TEAM_ADMIN)
    new_key, new_record = store.rotate(record.key_id)
    assert store.verify(key) is None and store.verify(new_key) is not None
    assert new_record.role is Role.TEAM_ADMIN and new_record.team == "ads"
    store.revoke(new_record.key_id)
    assert store.verify(new_key) is None
    assert store.verifier().verify(new_key) is None
    with sqlite3.connect(tmp_path / "keys.db") as db:
        assert db.execute("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NOT NULL").fetchone()[0] == 2


def test_verifier_snapshot_matches_store(tmp_path: Path) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, _ = store.create("search", Role.MEMBER)
    assert store.verifier().verify(key) == store.verify(key)


@pytest.mark.parametrize(
    ("role", "action", "team", "expected"),
    [
        (Role.MEMBER, Action.CALL_GATEWAY, "support", True),
        (Role.MEMBER, Action.CALL_GATEWAY, "ads", False),
        (Role.MEMBER, Action.READ_SPEND, "support", False),
        (Role.TEAM_ADMIN, Action.READ_SPEND, "support", True),
        (Role.TEAM_ADMIN, Action.READ_AUDIT, "support", True),
        (Role.TEAM_ADMIN, Action.READ_AUDIT, "ads", False),
        (Role.TEAM_ADMIN, Action.READ_SPEND, None, False),
        (Role.AUDITOR, Action.READ_AUDIT, "ads", True),
        (Role.AUDITOR, Action.READ_AUDIT, None, True),
        (Role.AUDITOR, Action.CALL_GATEWAY, "ads", False),
        (Role.AUDITOR, Action.MANAGE_KEYS, "ads", False),
        (Role.PLATFORM_ADMIN, Action.OPERATE, None, True),
    ],
)
def test_role_matrix(tmp_path: Path, role: Role, action: Action, team: str | None, expected: bool) -> None:
    store = KeyStore(tmp_path / "keys.db")
    key, _ = store.create("platform" if role in (Role.AUDITOR, Role.PLATFORM_ADMIN) else "support", role)
    who = store.verify(key)
    assert who is not None
    assert allowed(who, action, team) is expected
    if not expected:
        with pytest.raises(Forbidden, match=role.value):
            authorize(who, action, team)


def test_cli_keys_are_role_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    state = str(tmp_path / "state")
    monkeypatch.delenv("SWITCHYARD_API_KEY", raising=False)
    # No key at all: refused.
    assert main(["keys", "create", "--team", "support", "--state-dir", state]) == 3
    admin, _ = KeyStore(Path(state) / "keys.db").create("platform", Role.PLATFORM_ADMIN)
    assert (
        main(
            [
                "keys",
                "create",
                "--team",
                "support",
                "--role",
                "team-admin",
                "--state-dir",
                state,
                "--api-key",
                admin,
                "--json",
            ]
        )
        == 0
    )
    import json

    team_admin = json.loads(capsys.readouterr().out)["key"]
    # A team admin may issue member keys for its team, not for another team, not auditor keys.
    assert main(["keys", "create", "--team", "support", "--state-dir", state, "--api-key", team_admin]) == 0
    assert main(["keys", "create", "--team", "ads", "--state-dir", state, "--api-key", team_admin]) == 3
    assert (
        main(
            ["keys", "create", "--team", "platform", "--role", "auditor", "--state-dir", state, "--api-key", team_admin]
        )
        == 3
    )
    # Unknown team is a clear error, not a key.
    assert main(["keys", "create", "--team", "nosuchteam", "--state-dir", state, "--api-key", admin]) == 2
    err = capsys.readouterr().err
    assert "unknown team 'nosuchteam'" in err
    # Listing never prints secrets.
    assert main(["keys", "list", "--team", "support", "--state-dir", state, "--api-key", team_admin]) == 0
    listing = capsys.readouterr().out
    assert team_admin.split("_", 2)[2] not in listing and "team-admin" in listing
