"""Each store's schema, as numbered migrations, and the version check every store makes at open.

A store (keys, audit, subject keys, idempotency, ledger) declares its migrations in order;
version N is "the first N applied". `schema_versions` holds one row per store. Who migrates:

- **SQLite** (one host, one code version): the store migrates when it opens, as it always
  created its tables.
- **Postgres** (a cluster): `switchyard up` (and `switchyard db migrate`) migrates; a gateway
  replica only checks, and refuses to start on a database that is behind its code (run the
  migration) or ahead of it (an older build during a rolling upgrade must not write a schema
  it does not know).

Migrations run under the store's lock in one transaction (Postgres DDL is transactional), so
two processes migrating at once apply each step once. Version 1 of every store is the schema
as it was before versions existed, written `IF NOT EXISTS`, so an existing database takes
version 1 without change.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from switchyard.db.engine import Database, Transaction, ddl, redacted

_VERSIONS = """CREATE TABLE IF NOT EXISTS schema_versions (
    component TEXT PRIMARY KEY,
    version   BIGINT NOT NULL
)"""

Step = str | Callable[[Transaction, Database], None]


class SchemaError(Exception):
    """The database's schema is not the one this code was written for (names the store, both
    versions and what to run)."""


@dataclass(frozen=True)
class Migration:
    version: int
    steps: tuple[Step, ...]  # SQL (with `{blob}`), or a function for what SQL alone cannot say


@dataclass(frozen=True)
class Schema:
    component: str
    migrations: tuple[Migration, ...]

    def __post_init__(self) -> None:
        numbers = [m.version for m in self.migrations]
        if numbers != list(range(1, len(numbers) + 1)):
            raise ValueError(f"{self.component}: migrations must be numbered 1..N, got {numbers}")

    @property
    def version(self) -> int:
        return len(self.migrations)


def _current(tx: Transaction, component: str) -> int:
    row = tx.execute("SELECT version FROM schema_versions WHERE component = ?", (component,)).one()
    return 0 if row is None else int(row[0])


def _table_exists(db: Database, tx: Transaction) -> bool:
    if db.dialect == "sqlite":
        sql = "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_versions'"
    else:
        sql = (
            "SELECT 1 FROM information_schema.tables"
            " WHERE table_name = 'schema_versions' AND table_schema = current_schema()"
        )
    return tx.execute(sql).one() is not None


def stored_version(db: Database, component: str) -> int:
    """The version the database is at for `component` (0: never migrated)."""
    with db.read() as tx:
        return _current(tx, component) if _table_exists(db, tx) else 0


def migrate(db: Database, schema: Schema) -> int:
    """Apply the migrations the database lacks; returns how many were applied."""
    with db.transaction() as tx:
        tx.lock("schema_versions")  # every migration of every store, one at a time
        tx.execute(_VERSIONS)
        at = _current(tx, schema.component)
        _refuse_newer(schema, at, db.url)
        for migration in schema.migrations[at:]:
            for step in migration.steps:
                if isinstance(step, str):
                    tx.execute(ddl(db, step))
                else:
                    step(tx, db)
        if at < schema.version:
            tx.execute(
                "INSERT INTO schema_versions (component, version) VALUES (?, ?)"
                " ON CONFLICT (component) DO UPDATE SET version = excluded.version",
                (schema.component, schema.version),
            )
        return schema.version - at


def check(db: Database, schema: Schema) -> None:
    """Raise `SchemaError` unless the database is at exactly this code's version."""
    at = stored_version(db, schema.component)
    _refuse_newer(schema, at, db.url)
    if at < schema.version:
        raise SchemaError(
            f"the {schema.component} schema in {redacted(db.url)} is at version {at}, this code needs"
            f" {schema.version}: run `switchyard db migrate` (or `switchyard up`, which migrates)"
        )


def prepare(db: Database, schema: Schema) -> None:
    """What a store does at open: migrate an embedded SQLite database, check a shared one."""
    if db.dialect == "sqlite":
        migrate(db, schema)
    else:
        check(db, schema)


def _refuse_newer(schema: Schema, at: int, url: str) -> None:
    if at > schema.version:
        raise SchemaError(
            f"the {schema.component} schema in {redacted(url)} is at version {at}, newer than this"
            f" code's {schema.version}: upgrade switchyard here before it uses that database"
        )


def migrate_all(databases: Sequence[tuple[Database, Schema]]) -> dict[str, int]:
    """`switchyard db migrate` / `switchyard up`: every store's pending migrations."""
    return {schema.component: migrate(db, schema) for db, schema in databases}
