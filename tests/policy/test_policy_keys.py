"""Keys are shown once, stored as hashes, and every role can do exactly what it should; the store
behaves the same on SQLite and on a Postgres that several processes share."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from switchyard.cli import main
from switchyard.db.engine import open_database
from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.migrations import SchemaError
from switchyard.policy.keys import SCHEMA, KeyStore, UnknownKeyError
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden, allowed, authorize
from tests.shared_db import fresh_postgres, postgres_url, shared_state_env, store_database
from tests.skewed_host import on_a_skewed_host


@pytest.fixture
def store(backend: str, tmp_path: Path) -> Iterator[KeyStore]:
    with KeyStore(store_database(backend, tmp_path / "keys.db", SCHEMA)) as store:
        yield store


def another_process(store: KeyStore) -> KeyStore:
    """A second store on `store`'s database, with its own connection: a replica or the CLI."""
    return KeyStore(open_database(store.db.url))


def test_only_the_hash_is_stored(store: KeyStore, backend: str, tmp_path: Path) -> None:
    key, _record = store.create("support", Role.MEMBER)
    secret = key.split("_", 2)[2]
    with store.db.read() as tx:
        rows = [tx.execute(f"SELECT * FROM {table}").rows for table in ("api_keys", "key_events")]
    assert rows[0] and rows[1] and secret not in repr(rows)
    if backend == "sqlite":
        raw = (tmp_path / "keys.db").read_bytes() + b"".join(p.read_bytes() for p in tmp_path.glob("keys.db-*"))
        assert secret.encode() not in raw
        assert (tmp_path / "keys.db").stat().st_mode & 0o077 == 0
    assert store.verify(key) is not None and store.verify(key).team == "support"  # type: ignore[union-attr]
    assert store.verify(key[:-1] + ("A" if key[-1] != "A" else "B")) is None
    assert store.verify("not-a-key") is None


def test_rotate_and_revoke(store: KeyStore) -> None:
    key, record = store.create("ads", Role.TEAM_ADMIN)
    new_key, new_record = store.rotate(record.key_id)
    assert store.verify(key) is None and store.verify(new_key) is not None
    assert new_record.role is Role.TEAM_ADMIN and new_record.team == "ads"
    revoked = store.revoke(new_record.key_id)
    assert revoked == store.get(new_record.key_id) and revoked.revoked_at is not None
    assert store.verify(new_key) is None
    assert store.verifier().verify(new_key) is None
    with store.db.read() as tx:
        assert tx.execute("SELECT COUNT(*) FROM api_keys WHERE revoked_at IS NOT NULL").rows[0][0] == 2


def test_verifier_snapshot_matches_store(store: KeyStore) -> None:
    key, _ = store.create("search", Role.MEMBER)
    assert store.verifier().verify(key) == store.verify(key)


def test_timestamps_keep_their_precision(store: KeyStore) -> None:
    """Regression: a REAL column is float4 on Postgres, which would round a time of today to 128 s."""
    _, record = store.create("search", Role.MEMBER, expires_at=1_800_000_000.123456)
    stored = store.get(record.key_id)
    assert stored is not None
    assert stored.created_at == record.created_at and stored.expires_at == 1_800_000_000.123456


@pytest.mark.parametrize(
    ("role", "action", "team", "expected"),
    [
        (Role.MEMBER, Action.CALL_GATEWAY, "support", True),
        (Role.MEMBER, Action.CALL_GATEWAY, "ads", False),
        (Role.MEMBER, Action.READ_SPEND, "support", False),
        (Role.MEMBER, Action.VIEW_TEAM, "support", True),
        (Role.MEMBER, Action.VIEW_TEAM, "ads", False),
        (Role.MEMBER, Action.VIEW_TEAM, None, False),
        (Role.AUDITOR, Action.VIEW_TEAM, None, True),
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
def test_role_matrix(store: KeyStore, role: Role, action: Action, team: str | None, expected: bool) -> None:
    key, _ = store.create("platform" if role in (Role.AUDITOR, Role.PLATFORM_ADMIN) else "support", role)
    who = store.verify(key)
    assert who is not None
    assert allowed(who, action, team) is expected
    if not expected:
        with pytest.raises(Forbidden, match=role.value):
            authorize(who, action, team)


def test_cli_keys_are_role_checked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    state = str(tmp_path / "state")
    monkeypatch.delenv("SWITCHYARD_API_KEY", raising=False)
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    for name, value in shared_state_env(backend, SCHEMA).items():
        monkeypatch.setenv(name, value)
    # No key at all: refused.
    assert main(["keys", "create", "--team", "support", "--state-dir", state]) == 3
    with KeyStore.in_state_dir(Path(state)) as keys:
        admin, _ = keys.create("platform", Role.PLATFORM_ADMIN)
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


@pytest.mark.parametrize("expires", ["999999999999d", "1000000w", "9999-12-31T23:59:59-01:00"])
def test_an_expiry_past_the_last_printable_date_creates_no_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, expires: str
) -> None:
    """`--expires 999999999999d` stored the key, then failed printing its expiry
    (`OSError: Value too large`), so its secret was never shown; and from then on `keys list`
    failed for every caller."""
    state = str(tmp_path / "state")
    monkeypatch.delenv("SWITCHYARD_API_KEY", raising=False)
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    with KeyStore.in_state_dir(Path(state)) as keys:
        admin, _ = keys.create("platform", Role.PLATFORM_ADMIN)
    create = ["keys", "create", "--team", "ads", "--expires", expires, "--state-dir", state, "--api-key", admin]
    assert main(create) == 2
    assert f"--expires: {expires!r} is past 9999-12-31" in capsys.readouterr().err
    assert main(["keys", "list", "--state-dir", state, "--api-key", admin]) == 0
    assert "ads" not in capsys.readouterr().out
    with KeyStore.in_state_dir(Path(state)) as keys, pytest.raises(ValueError, match="up to 9999-12-31"):
        keys.create("ads", Role.MEMBER, expires_at=1e12)


# ---------------------------------------------------------------- one database, several processes


def test_another_process_sees_creates_and_revokes(store: KeyStore) -> None:
    """Regression: `mtime()` was a file's mtime, which says nothing about a Postgres database;
    `version()` is the key-event chain's head, the same on both backends."""
    with another_process(store) as replica:
        before, stale = replica.version(), replica.verifier()
        key, record = store.create("support", Role.MEMBER)
        assert replica.version() != before
        assert replica.verifier().verify(key) is not None and stale.verify(key) is None
        created = store.version()
        assert replica.version() == created
        replica.revoke(record.key_id)  # the CLI revokes; the gateway's store must notice
        assert store.version() != created
        assert store.verifier().verify(key) is None and store.verify(key) is None


class FrozenClock:
    def __call__(self) -> float:
        return 1_800_000_000.0


def test_every_change_moves_the_version_even_within_one_instant(backend: str, tmp_path: Path) -> None:
    """Regression: two writes inside the filesystem's mtime granularity left `mtime()` unchanged,
    so a gateway could keep serving a key revoked just after it was created."""
    with KeyStore(store_database(backend, tmp_path / "keys.db", SCHEMA), FrozenClock()) as store:
        versions = [store.version()]
        _, record = store.create("support", Role.MEMBER)
        versions.append(store.version())
        _, rotated = store.rotate(record.key_id)
        versions.append(store.version())
        store.revoke(rotated.key_id)
        versions.append(store.version())
        assert versions == sorted(set(versions)) and len(versions) == 4
        with pytest.raises(UnknownKeyError):
            store.revoke(rotated.key_id)  # refused: nothing changed, so neither does the version
        assert store.version() == versions[-1]


def test_concurrent_creates_from_several_processes_keep_one_unbroken_chain(store: KeyStore) -> None:
    """Each writer has its own connection: the chain's head is read and extended under one lock
    on both backends, so no two events claim one predecessor and no seq is skipped."""
    writers, each = 4, 8
    start = threading.Barrier(writers)

    def write() -> None:
        with another_process(store) as mine:
            start.wait()
            for i in range(each):
                mine.create("support", Role.MEMBER, note=f"{threading.get_ident()}-{i}")

    with ThreadPoolExecutor(writers) as pool:
        running = [pool.submit(write) for _ in range(writers)]
    for writer in running:
        writer.result()  # a writer's exception, raised here
    assert store.verify_events() == []
    assert [e.seq for e in store.events()] == list(range(1, writers * each + 1))
    assert store.version() == writers * each and len(store.list()) == writers * each


def test_two_rotations_of_one_key_cannot_both_succeed(store: KeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: the active check and the revoke are one serialised step on Postgres too (there a
    plain transaction would let both admins see the key active and each get a successor)."""
    _, record = store.create("ads", Role.TEAM_ADMIN)
    checked, second_finished = threading.Event(), threading.Event()
    outcomes: list[str] = []
    active = KeyStore._active

    with another_process(store) as first, another_process(store) as second:

        def held_open(self: KeyStore, tx: Any, key_id: str) -> Any:
            found = active(self, tx, key_id)
            if self is first:
                checked.set()
                second_finished.wait(0.5)  # unserialised, the second rotation completes in here
            return found

        def rotate(keys: KeyStore) -> None:
            try:
                keys.rotate(record.key_id)
                outcomes.append("rotated")
            except UnknownKeyError:
                outcomes.append("refused")

        monkeypatch.setattr(KeyStore, "_active", held_open)
        racer = threading.Thread(target=rotate, args=(first,))
        racer.start()
        assert checked.wait(10)
        rotate(second)
        second_finished.set()
        racer.join()
    assert sorted(outcomes) == ["refused", "rotated"]
    assert [e.action for e in store.events()] == ["create", "rotate"]
    assert len(store.list("ads")) == 1 and store.verify_events() == []


def test_a_rolled_back_change_leaves_no_gap_in_the_chain(store: KeyStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Regression: seq is the head's + 1, written in the change's transaction; an identity column
    would burn a number on a Postgres rollback, which the chain check reports as a deleted event."""
    store.create("support", Role.MEMBER)
    event = KeyStore._event

    def then_fail(self: KeyStore, *args: Any, **kwargs: Any) -> None:
        event(self, *args, **kwargs)
        raise RuntimeError("the process died after appending its event")

    with monkeypatch.context() as patched:
        patched.setattr(KeyStore, "_event", then_fail)
        with pytest.raises(RuntimeError):
            store.create("support", Role.MEMBER, note="rolled back")
    assert store.version() == 1
    store.create("support", Role.MEMBER)
    assert [e.seq for e in store.events()] == [1, 2] and store.verify_events() == []
    assert [r.note for r in store.list()] == ["", ""]


def test_a_shared_database_that_was_never_migrated_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway replica only checks the Postgres schema (`switchyard up` migrates it)."""
    fresh_postgres().close()
    monkeypatch.setenv(DATABASE_URL_ENV, postgres_url())
    with pytest.raises(SchemaError, match=r"the keys schema .* is at version 0, this code needs 3"):
        KeyStore.in_state_dir(tmp_path / "state")


# A gateway replica or CLI on another host (`on_a_skewed_host`): does its key snapshot, and
# the store itself, take the key `argv[2]`?
_TAKES_THE_KEY = """
import sys
from switchyard.db.engine import open_database
from switchyard.policy.keys import KeyStore
store = KeyStore(open_database(sys.argv[1]))
print(store.verifier().verify(sys.argv[2]) is not None, store.verify(sys.argv[2]) is not None)
"""


@pytest.mark.parametrize("skew_s", [-600.0, 600.0], ids=["10min-behind", "10min-ahead"])
def test_a_host_whose_clock_is_off_judges_expiry_by_the_databases_clock(store: KeyStore, skew_s: float) -> None:
    """Stop 48: a key's expiry was judged by the clock of the host checking it. A gateway
    replica (its key snapshot) or a CLI 10 minutes behind accepted a key for 10 minutes after
    it expired; one 10 minutes ahead refused a key 10 minutes before its expiry. Both now go
    by the database's clock (the snapshot counts on from it monotonically)."""
    expired, _ = store.create("search", Role.MEMBER, expires_at=time.time() - 300)
    valid, _ = store.create("search", Role.MEMBER, expires_at=time.time() + 300)
    seen = {}
    for name, key in (("expired", expired), ("valid", valid)):
        seen[name] = on_a_skewed_host(skew_s, _TAKES_THE_KEY, store.db.url, key).split()
    assert seen == {"expired": ["False", "False"], "valid": ["True", "True"]}
