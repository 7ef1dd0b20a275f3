"""Fixtures for the audit tests: the shipped data policies, one shared Presidio scrubber, an
S3 endpoint (moto's server on 127.0.0.1) with a client for it, and the audit store and
subject keyring on both backends (`tests.shared_db`).

On SQLite the store and the keyring are two files (the keys one with secure delete); on
Postgres they share one fresh database, as one `SWITCHYARD_DATABASE_URL` puts them in a cluster.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from _audit_stores import AuditDatabases, store_on
from moto.server import ThreadedMotoServer

from switchyard.audit.anchors import ANCHORS_FILE
from switchyard.audit.data_policy import load_data_policies
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import SCHEMA as AUDIT_SCHEMA
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SCHEMA as SUBJECT_KEYS_SCHEMA
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.db.engine import open_database
from switchyard.db.location import DATABASE_URL_ENV
from switchyard.db.schemas import store_schemas
from switchyard.paths import repo_root
from switchyard.policy.models import DataPolicies
from tests.shared_db import shared_state_env, store_database


@pytest.fixture(scope="session")
def data_policies() -> DataPolicies:
    return load_data_policies(repo_root() / "policies")


@pytest.fixture(scope="session")
def scrubber() -> TextScrubber:
    return TextScrubber()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    # Dummy credentials, only for this test: moto accepts any.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.fixture
def audit_databases(backend: str, tmp_path: Path) -> Iterator[AuditDatabases]:
    audit = store_database(backend, tmp_path / "audit" / "audit.db", AUDIT_SCHEMA, SUBJECT_KEYS_SCHEMA)
    if backend == "sqlite":
        keys = store_database(backend, tmp_path / "audit" / "keys.db", secure_delete=True)
    else:
        keys = open_database(audit.url)  # the same database, over a connection of its own
    try:
        yield audit, keys
    finally:
        audit.close()
        keys.close()


@pytest.fixture
def audit_store(audit_databases: AuditDatabases, tmp_path: Path) -> AuditStore:
    return store_on(audit_databases[0], tmp_path / "audit" / ANCHORS_FILE)


@pytest.fixture
def keyring(audit_databases: AuditDatabases) -> SubjectKeyring:
    return SubjectKeyring(audit_databases[1])


@pytest.fixture
def audit_state(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory whose audit store and keyring are on `backend`: SQLite files in it, or
    a fresh Postgres named by `SWITCHYARD_DATABASE_URL`, as a cluster node's state directory.
    What opens stores by state directory (the CLI, the gateway's factories) uses it."""
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    # Every store's schema: the CLI opens the API keys too.
    for name, value in shared_state_env(backend, *store_schemas().values()).items():
        monkeypatch.setenv(name, value)
    return tmp_path
