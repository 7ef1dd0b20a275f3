"""`switchyard db migrate|status` and `switchyard up`'s refusals, as an operator runs them: the
CLI in its own process, on SQLite and on a real Postgres."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest

from switchyard.db.engine import open_database, postgres_lock_key
from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.migrations import SchemaError
from switchyard.db.schemas import store_schemas
from switchyard.policy.keys import SCHEMA as KEYS
from switchyard.policy.keys import KeyStore
from switchyard.state import STATE_DIR_ENV
from tests.shared_db import fresh_postgres, postgres_url

REPO = Path(__file__).resolve().parents[1]


def _env(backend: str, state: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != DATABASE_URL_ENV}
    env[STATE_DIR_ENV] = str(state)
    if backend == "postgres":
        fresh_postgres().close()  # empty: nothing migrated yet
        env[DATABASE_URL_ENV] = postgres_url()
    return env


def _switchyard(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args], capture_output=True, text=True, env=env, timeout=120, cwd=REPO
    )


def test_status_shows_a_fresh_database_behind_then_migrate_brings_every_store_up(backend: str, tmp_path: Path) -> None:
    env = _env(backend, tmp_path / "state")
    before = _switchyard(env, "db", "status", "--json")
    assert before.returncode == 1, before.stderr
    rows = json.loads(before.stdout)
    assert {r["store"] for r in rows} == {"keys", "audit", "subject_keys", "idempotency", "ledger"}
    assert {r["state"] for r in rows} == {"behind"}
    assert all("postgres" in r["database"] if backend == "postgres" else "sqlite" in r["database"] for r in rows)
    migrated = _switchyard(env, "db", "migrate", "--json")
    assert migrated.returncode == 0, migrated.stderr
    assert json.loads(migrated.stdout)["applied"] == {s.value: schema.version for s, schema in store_schemas().items()}
    again = _switchyard(env, "db", "migrate")
    assert again.returncode == 0 and again.stdout.count("up to date") == 5
    after = _switchyard(env, "db", "status")
    assert after.returncode == 0, after.stdout + after.stderr
    assert after.stdout.count(" ok") == 5


def test_a_database_ahead_of_the_code_is_refused_by_name(backend: str, tmp_path: Path) -> None:
    env = _env(backend, tmp_path / "state")
    assert _switchyard(env, "db", "migrate").returncode == 0
    url = env.get(DATABASE_URL_ENV) or f"sqlite:///{tmp_path / 'state' / 'keys.db'}"
    db = open_database(url)
    with db.transaction() as tx:  # what a newer build's migration leaves behind
        tx.execute("UPDATE schema_versions SET version = 7 WHERE component = 'keys'")
    status = _switchyard(env, "db", "status")
    assert status.returncode == 1 and "ahead" in status.stdout
    with pytest.raises(SchemaError, match=rf"keys schema .* is at version 7, newer than this code.s {KEYS.version}"):
        KeyStore(db)
    db.close()


def test_a_migration_behind_a_lock_not_let_go_fails_in_the_lock_timeout_naming_it(tmp_path: Path) -> None:
    """Another session holds the migrations' lock and does not go on (an operator's open
    session, a stuck migration): `db migrate` fails in 10 s naming the lock timeout, and the
    store it was migrating is left as it was. Postgres's default waits for as long as the lock
    is held."""
    env = _env("postgres", tmp_path / "state")
    holder = psycopg.connect(postgres_url(), autocommit=True)
    try:
        holder.execute("BEGIN")
        holder.execute("SELECT pg_advisory_xact_lock(%s)", (postgres_lock_key("schema_versions"),))
        started = time.monotonic()
        migrated = _switchyard(env, "db", "migrate")
        took = time.monotonic() - started
    finally:
        holder.close()
    assert migrated.returncode == 1 and took < 60, (took, migrated.stderr)
    assert "cannot migrate" in migrated.stderr and "lock timeout" in migrated.stderr, migrated.stderr
    assert "Traceback" not in migrated.stderr
    status = _switchyard(env, "db", "status", "--json")
    assert {r["state"] for r in json.loads(status.stdout)} == {"behind"}


def test_a_gateway_replica_refuses_a_shared_database_nobody_migrated() -> None:
    db = fresh_postgres()
    with pytest.raises(SchemaError, match="run `switchyard db migrate`"):
        KeyStore(db)
    db.close()


def test_up_refuses_a_sqlite_url_for_the_shared_state_before_starting_anything(tmp_path: Path) -> None:
    env = {**os.environ, STATE_DIR_ENV: str(tmp_path / "state"), DATABASE_URL_ENV: f"sqlite:///{tmp_path}/all.db"}
    up = _switchyard(env, "up", "--detach")
    assert up.returncode == 1
    assert f"{DATABASE_URL_ENV}=sqlite:///" in up.stderr and "expected postgresql://" in up.stderr
    assert "Traceback" not in up.stderr
    assert not (tmp_path / "state" / "up.json").exists()
