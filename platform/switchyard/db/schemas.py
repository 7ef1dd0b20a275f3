"""Every shared store's schema, for `switchyard up` and `switchyard db migrate|status`."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from switchyard.audit.store import SCHEMA as AUDIT
from switchyard.audit.subject_keys import SCHEMA as SUBJECT_KEYS
from switchyard.budgets.ledger import SCHEMA as LEDGER
from switchyard.db.location import Store, open_store, redacted_store_url
from switchyard.db.migrations import Schema, migrate, stored_version
from switchyard.gateway.idempotency_sql import SCHEMA as IDEMPOTENCY
from switchyard.policy.keys import SCHEMA as KEYS


def store_schemas() -> dict[Store, Schema]:
    return {
        Store.KEYS: KEYS,
        Store.AUDIT: AUDIT,
        Store.SUBJECT_KEYS: SUBJECT_KEYS,
        Store.IDEMPOTENCY: IDEMPOTENCY,
        Store.LEDGER: LEDGER,
    }


def migrate_stores(state: Path, env: Mapping[str, str] | None = None) -> dict[str, int]:
    """Apply every store's pending migrations; returns how many each store took."""
    applied = {}
    for store, schema in store_schemas().items():
        db = open_store(state, store, env)
        try:
            applied[store.value] = migrate(db, schema)
        finally:
            db.close()
    return applied


def store_versions(state: Path, env: Mapping[str, str] | None = None) -> list[dict[str, object]]:
    """Each store's database (password hidden), its schema version and this code's."""
    rows: list[dict[str, object]] = []
    for store, schema in store_schemas().items():
        db = open_store(state, store, env)
        try:
            at = stored_version(db, schema.component)
        finally:
            db.close()
        rows.append(
            {
                "store": store.value,
                "database": redacted_store_url(state, store, env),
                "version": at,
                "code_version": schema.version,
                "state": "ok" if at == schema.version else ("behind" if at < schema.version else "ahead"),
            }
        )
    return rows
