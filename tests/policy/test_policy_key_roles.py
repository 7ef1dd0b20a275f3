"""Key roles: who may manage which keys, the reserved `platform` team, expiry, and the key-event log."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from switchyard.audit.chain import GENESIS, link_hash
from switchyard.cli import main
from switchyard.db.engine import SqliteDatabase
from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.migrations import stored_version
from switchyard.policy.keys import SCHEMA, KeyStore
from switchyard.policy.models import Role
from tests.shared_db import shared_state_env, store_database


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, backend: str) -> Path:
    """A state directory whose keys are on `backend` (Postgres: `$SWITCHYARD_DATABASE_URL`)."""
    monkeypatch.delenv("SWITCHYARD_API_KEY", raising=False)
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    for name, value in shared_state_env(backend, SCHEMA).items():
        monkeypatch.setenv(name, value)
    return tmp_path / "state"


@pytest.fixture
def store(state: Path) -> Iterator[KeyStore]:
    """The state directory's key store, as `switchyard up` and the CLI open it."""
    with KeyStore.in_state_dir(state) as store:
        yield store


def keys_cli(state: Path, key: str, *argv: str) -> int:
    return main(["keys", *argv, "--state-dir", str(state), "--api-key", key])


# ---------------------------------------------------------------- finding 4


def test_team_admin_of_team_platform_cannot_rotate_or_revoke_the_platform_admin_key(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str]
) -> None:
    """Regression: `keys rotate` authorised on the target key's *team*, so a team admin of a
    team named `platform` could rotate the operator's key and receive a new platform-admin key."""
    admin, admin_record = store.create("platform", Role.PLATFORM_ADMIN)
    # A team-admin key of team `platform`, as one issued while a teams/platform.yaml existed.
    team_admin, _ = store.create("platform", Role.TEAM_ADMIN)
    capsys.readouterr()
    assert keys_cli(state, team_admin, "rotate", admin_record.key_id, "--json") == 3
    out = capsys.readouterr()
    assert "sy_" not in out.out and "may not manage" in out.err
    assert keys_cli(state, team_admin, "revoke", admin_record.key_id) == 3
    who = store.verify(admin)
    assert who is not None and who.role is Role.PLATFORM_ADMIN  # still the operator's, untouched
    assert [r.role for r in store.list("platform")] == [Role.PLATFORM_ADMIN, Role.TEAM_ADMIN]


def test_team_admin_still_manages_its_own_teams_keys(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str]
) -> None:
    team_admin, _ = store.create("support", Role.TEAM_ADMIN)
    member, member_record = store.create("support", Role.MEMBER)
    _, other_admin = store.create("support", Role.TEAM_ADMIN)
    _, auditor = store.create("platform", Role.AUDITOR)
    _, ads_member = store.create("ads", Role.MEMBER)
    capsys.readouterr()
    assert keys_cli(state, team_admin, "rotate", member_record.key_id, "--json") == 0
    rotated = json.loads(capsys.readouterr().out)
    assert store.verify(member) is None and store.verify(rotated["key"]) is not None
    assert keys_cli(state, team_admin, "revoke", other_admin.key_id) == 0
    assert keys_cli(state, team_admin, "revoke", auditor.key_id) == 3  # the platform's key
    assert keys_cli(state, team_admin, "revoke", ads_member.key_id) == 3  # another team's key


@pytest.mark.parametrize("role", ["member", "team-admin"])
def test_team_platform_is_reserved_for_platform_keys(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str], role: str
) -> None:
    admin, _ = store.create("platform", Role.PLATFORM_ADMIN)
    assert keys_cli(state, admin, "create", "--team", "platform", "--role", role) == 2
    assert "team 'platform' is reserved" in capsys.readouterr().err
    assert keys_cli(state, admin, "create", "--team", "platform", "--role", "auditor") == 0


def test_a_policy_team_named_platform_is_a_violation(policies_copy: Path) -> None:
    from switchyard.policy.errors import PolicyError
    from switchyard.policy.loader import load_policy_set

    text = (policies_copy / "teams" / "ads.yaml").read_text().replace("team: ads", "team: platform", 1)
    (policies_copy / "teams" / "platform.yaml").write_text(text)
    with pytest.raises(PolicyError) as info:
        load_policy_set(policies_copy)
    found = [str(v) for v in info.value.violations]
    assert any(v.startswith("teams/platform.yaml: team: the team name 'platform' is reserved") for v in found), found


# ---------------------------------------------------------------- expiry


class Clock:
    def __init__(self, now: float = 1_800_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def test_expired_key_is_refused_by_the_store_and_the_gateway_snapshot(backend: str, tmp_path: Path) -> None:
    from switchyard.gateway.auth import KeySnapshot
    from switchyard.gateway.errors import Unauthenticated

    clock = Clock()
    with KeyStore(store_database(backend, tmp_path / "keys.db", SCHEMA), clock) as store:
        key, record = store.create("support", Role.MEMBER, expires_at=clock.now + 60)
        forever, _ = store.create("support", Role.MEMBER)
        snapshot = KeySnapshot(store.verifier(), store.version())  # long-lived: taken once, before expiry
        headers = {"authorization": f"Bearer {key}"}
        assert store.verify(key) is not None and snapshot.authenticate(headers).key_id == record.key_id
        clock.now += 60
        assert store.verify(key) is None and store.verifier().verify(key) is None
        with pytest.raises(Unauthenticated) as err:
            snapshot.authenticate(headers)
        assert err.value.status == 401 and err.value.code == "invalid_api_key"
        assert snapshot.authenticate({"authorization": f"Bearer {forever}"}).team == "support"
        clock.now += 10 * 365 * 86_400
        assert store.verify(forever) is not None


def test_cli_expires_is_stored_listed_and_not_carried_over_by_rotate(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str]
) -> None:
    admin, _ = store.create("platform", Role.PLATFORM_ADMIN)
    assert keys_cli(state, admin, "create", "--team", "platform", "--role", "auditor", "--expires", "2099-01-31") == 0
    assert "expires 2099-01-31 00:00:00 UTC" in capsys.readouterr().out
    assert (
        keys_cli(state, admin, "create", "--team", "platform", "--role", "auditor", "--expires", "30d", "--json") == 0
    )
    created = json.loads(capsys.readouterr().out)
    assert created["expires_at"] == pytest.approx(time.time() + 30 * 86_400, abs=60)
    assert keys_cli(state, admin, "list", "--team", "platform") == 0
    listing = capsys.readouterr().out
    assert "expires" in listing.splitlines()[0] and "2099-01-31 00:00:00 UTC" in listing and "never" in listing
    assert keys_cli(state, admin, "rotate", created["key_id"], "--json") == 0
    assert json.loads(capsys.readouterr().out)["expires_at"] is None
    record = store.list("platform")[-1]
    assert keys_cli(state, admin, "rotate", record.key_id, "--expires", "2099-06-01T12:00:00+02:00", "--json") == 0
    expected = datetime(2099, 6, 1, 10, 0, tzinfo=UTC).timestamp()
    assert json.loads(capsys.readouterr().out)["expires_at"] == expected


@pytest.mark.parametrize("bad", ["30x", "tomorrow", "2001-01-01", "0d"])
def test_bad_expires_is_a_clear_error(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str], bad: str
) -> None:
    admin, _ = store.create("platform", Role.PLATFORM_ADMIN)
    argv = ["create", "--team", "platform", "--role", "auditor", "--expires", bad]
    assert keys_cli(state, admin, *argv) == 2
    assert f"--expires: {bad!r}" in capsys.readouterr().err
    assert len(store.list()) == 1


def test_old_key_database_gains_expires_at(tmp_path: Path) -> None:
    """A SQLite file from before keys could expire, and before schemas had versions, migrates
    to the current version when it opens."""
    path = tmp_path / "keys.db"
    with sqlite3.connect(path) as db:  # the schema before keys could expire
        db.execute(
            "CREATE TABLE api_keys (key_id TEXT PRIMARY KEY, team TEXT NOT NULL, role TEXT NOT NULL,"
            " secret_hash TEXT NOT NULL, created_at REAL NOT NULL, revoked_at REAL, note TEXT NOT NULL DEFAULT '')"
        )
        db.execute("INSERT INTO api_keys VALUES ('abc', 'support', 'member', 'x', 1.0, NULL, '')")
    with KeyStore(SqliteDatabase(path)) as store:
        assert stored_version(store.db, "keys") == SCHEMA.version == 3  # 2: platform secrets, 3: console sessions
        assert store.get("abc") is not None and store.get("abc").expires_at is None  # type: ignore[union-attr]
        key, _ = store.create("support", Role.MEMBER, expires_at=2e9)
        assert store.verify_events() == [] and store.version() == 1
    with KeyStore(SqliteDatabase(path)) as reopened:  # a second open finds the column and changes nothing
        assert reopened.verify(key) is not None and stored_version(reopened.db, "keys") == SCHEMA.version
    assert path.stat().st_mode & 0o077 == 0


def test_a_chain_written_before_schema_versions_continues_unbroken(tmp_path: Path) -> None:
    """A keys.db at today's schema (AUTOINCREMENT seq, REAL times, no `schema_versions`) takes
    version 1 unchanged, and the next event links to its last one."""
    path = tmp_path / "keys.db"
    payload = json.dumps({"time": 1.0, "action": "create", "key_id": "abc", "team": "support"})
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE api_keys (key_id TEXT PRIMARY KEY, team TEXT NOT NULL, role TEXT NOT NULL,"
            " secret_hash TEXT NOT NULL, created_at REAL NOT NULL, revoked_at REAL,"
            " note TEXT NOT NULL DEFAULT '', expires_at REAL)"
        )
        db.execute(
            "CREATE TABLE key_events (seq INTEGER PRIMARY KEY AUTOINCREMENT, team TEXT NOT NULL,"
            " time REAL NOT NULL, payload TEXT NOT NULL, prev_hash TEXT NOT NULL, hash TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO key_events (team, time, payload, prev_hash, hash) VALUES ('support', 1.0, ?, ?, ?)",
            (payload, GENESIS, link_hash(GENESIS, payload)),
        )
    with KeyStore(SqliteDatabase(path)) as store:
        assert store.version() == 1
        store.create("support", Role.MEMBER)
        assert store.verify_events() == [] and store.version() == 2
        with store.db.read() as tx:
            assert [r[0] for r in tx.execute("SELECT seq FROM key_events ORDER BY seq").rows] == [1, 2]


# ---------------------------------------------------------------- key events


def test_key_changes_are_chained_events_without_secrets(
    state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str]
) -> None:
    admin, admin_record = store.create("platform", Role.PLATFORM_ADMIN)  # as `switchyard up` makes it
    assert keys_cli(state, admin, "create", "--team", "support", "--role", "team-admin", "--json") == 0
    created = json.loads(capsys.readouterr().out)
    assert keys_cli(state, admin, "rotate", created["key_id"], "--expires", "7d", "--json") == 0
    rotated = json.loads(capsys.readouterr().out)
    assert keys_cli(state, admin, "revoke", rotated["key_id"]) == 0
    assert keys_cli(state, created["key"], "revoke", admin_record.key_id) == 3  # refused: not an event
    events = store.events()
    assert [(e.action, e.key_id, e.team, e.role, e.by_key_id, e.by_role) for e in events] == [
        ("create", admin_record.key_id, "platform", Role.PLATFORM_ADMIN, None, None),
        ("create", created["key_id"], "support", Role.TEAM_ADMIN, admin_record.key_id, Role.PLATFORM_ADMIN),
        ("rotate", created["key_id"], "support", Role.TEAM_ADMIN, admin_record.key_id, Role.PLATFORM_ADMIN),
        ("revoke", rotated["key_id"], "support", Role.TEAM_ADMIN, admin_record.key_id, Role.PLATFORM_ADMIN),
    ]
    assert events[2].new_key_id == rotated["key_id"] and events[2].expires_at == rotated["expires_at"]
    assert store.verify_events() == []
    capsys.readouterr()
    assert keys_cli(state, admin, "events", "--json") == 0
    shown = capsys.readouterr().out
    assert json.loads(shown)["ok"] is True
    for key in (admin, created["key"], rotated["key"]):
        assert key.split("_", 2)[2] not in shown
    # A team admin reads its own team's events only; the table names who acted.
    reader, _ = store.create("support", Role.TEAM_ADMIN)
    assert keys_cli(state, reader, "events", "--team", "support") == 0
    table = capsys.readouterr().out
    assert "rotate" in table and f"{admin_record.key_id} (platform-admin)" in table and "platform " not in table
    assert keys_cli(state, reader, "events") == 3


def test_an_edited_key_event_breaks_the_chain(state: Path, store: KeyStore, capsys: pytest.CaptureFixture[str]) -> None:
    admin, _ = store.create("platform", Role.PLATFORM_ADMIN)
    store.create("support", Role.MEMBER)
    with store.db.transaction() as tx:  # someone with write access to the database
        tx.execute("UPDATE key_events SET payload = replace(payload, 'member', 'team-admin') WHERE seq = 2")
    assert [f.problem for f in store.verify_events()] == ["edited"]
    assert keys_cli(state, admin, "events") == 1
    assert "BROKEN seq 2: edited" in capsys.readouterr().out
