"""Audit stores for the tests: over a given database, and more connections to one database."""

from __future__ import annotations

from pathlib import Path

from switchyard.audit.anchors import AnchorLog
from switchyard.audit.store import AuditStore
from switchyard.db.engine import Database, open_database

AuditDatabases = tuple[Database, Database]  # the audit store's, the subject keyring's


def another_connection(db: Database, *, secure_delete: bool = False) -> Database:
    """The same database over a new connection, as another process or host opens it
    (`secure_delete`: the SQLite key file's settings)."""
    return open_database(db.url, secure_delete=secure_delete)


def store_on(db: Database, anchors: Path) -> AuditStore:
    """An audit store on `db` that anchors in the file `anchors` (its host's)."""
    anchors.parent.mkdir(parents=True, exist_ok=True)
    return AuditStore(db, AnchorLog(anchors))
