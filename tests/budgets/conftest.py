"""Fixtures for the budget tests: ledgers on SQLite and on a real Postgres, and Ray.

Postgres tests need `SWITCHYARD_TEST_POSTGRES_URL` (`eval "$(scripts/postgres.sh)"` sets it)
and fail without it: a ledger that was never tested on Postgres must not pass CI silently.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchyard.budgets.db import PostgresDatabase, SqliteDatabase
from switchyard.budgets.ledger import BudgetLedger

POSTGRES_ENV = "SWITCHYARD_TEST_POSTGRES_URL"


def postgres_url() -> str:
    url = os.environ.get(POSTGRES_ENV)
    if not url:
        pytest.fail(
            f"${POSTGRES_ENV} is not set: the ledger's Postgres tests need a real server. "
            'Run `eval "$(scripts/postgres.sh)"` first (it installs and starts a local one).'
        )
    return url


def fresh_postgres() -> PostgresDatabase:
    db = PostgresDatabase(postgres_url())
    with db.transaction() as tx:
        for table in ("budget_lines", "holds", "charges"):
            tx.execute(f"DROP TABLE IF EXISTS {table}")
    return db


@pytest.fixture(params=["sqlite", "postgres"])
def ledger(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BudgetLedger]:
    db = SqliteDatabase(tmp_path / "ledger.db") if request.param == "sqlite" else fresh_postgres()
    try:
        yield BudgetLedger(db)
    finally:
        db.close()


@pytest.fixture(scope="session")
def ray_session(request: pytest.FixtureRequest) -> Iterator[None]:
    """The suite's shared cluster where it exists; else one local cluster for these tests."""
    if importlib.util.find_spec("switchyard.cluster.head") is not None:
        request.getfixturevalue("ray_cluster")  # it sets Ray's environment before importing ray
        yield
        return
    import ray

    temp_dir = tempfile.mkdtemp(prefix="syb-", dir="/tmp")
    ray.init(
        address="local",
        num_cpus=4,
        namespace="switchyard-budgets",
        _temp_dir=temp_dir,
        include_dashboard=False,
        log_to_driver=False,
    )
    try:
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
