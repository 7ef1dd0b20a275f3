"""The two backends every store is tested on: SQLite files in a temp dir, and a real Postgres.

Postgres tests need `SWITCHYARD_TEST_POSTGRES_URL` (`eval "$(scripts/postgres.sh)"` sets it;
`make test` does) and fail without it: a store that was never tested on Postgres must not pass
CI silently. Each test gets an empty database (the `public` schema dropped and made again),
migrated to the schemas it asks for, as `switchyard up` would.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from switchyard.db.engine import Database, PostgresDatabase, SqliteDatabase
from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.migrations import Schema, migrate

POSTGRES_ENV = "SWITCHYARD_TEST_POSTGRES_URL"
BACKENDS = ("sqlite", "postgres")


def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.fail(
            f"${POSTGRES_ENV} is not set: the stores' Postgres tests need a real server. "
            'Run `eval "$(scripts/postgres.sh)"` first (it installs and starts a local one).'
        )
    return url


def fresh_postgres(*schemas: Schema) -> PostgresDatabase:
    """An empty database with `schemas` migrated; the caller closes it."""
    db = PostgresDatabase(postgres_url())
    db.outside_transaction("DROP SCHEMA IF EXISTS public CASCADE")
    db.outside_transaction("CREATE SCHEMA public")
    for schema in schemas:
        migrate(db, schema)
    return db


def shared_state_env(backend: str, *schemas: Schema) -> dict[str, str]:
    """The environment that points every store at `backend`: `{}` for the SQLite default, or
    `SWITCHYARD_DATABASE_URL` at a fresh Postgres with `schemas` migrated."""
    if backend == "sqlite":
        return {}
    fresh_postgres(*schemas).close()
    return {DATABASE_URL_ENV: postgres_url()}


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    """Which backend a store test runs on; every store test runs on both."""
    return str(request.param)


def store_database(backend: str, path: Path, *schemas: Schema, secure_delete: bool = False) -> Database:
    """One store's database on `backend`: a SQLite file at `path` (the store migrates it when
    it opens), or the fresh Postgres with `schemas` migrated. The caller closes it."""
    if backend == "sqlite":
        return SqliteDatabase(path, secure_delete=secure_delete)
    return fresh_postgres(*schemas)
