"""Fixtures for the budget tests: ledgers on SQLite and on a real Postgres, and Ray.

The backends are `tests.shared_db`'s: every ledger test runs on both.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchyard.budgets.ledger import SCHEMA, BudgetLedger
from tests.shared_db import store_database


@pytest.fixture
def ledger(backend: str, tmp_path: Path) -> Iterator[BudgetLedger]:
    db = store_database(backend, tmp_path / "ledger.db", SCHEMA)
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
