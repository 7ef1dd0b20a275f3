"""Fixtures for the budget tests: ledgers on SQLite and on a real Postgres, and Ray.

The backends are `tests.shared_db`'s: every ledger test runs on both. The ledger's database is
the suite's `ledger_db` (tests/conftest.py), which the gateway's money tests share.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from switchyard.budgets.ledger import BudgetLedger
from switchyard.db.engine import Database
from switchyard.db.location import DATABASE_URL_ENV, LEDGER_URL_ENV
from tests.shared_db import shared_state_env


@pytest.fixture
def ledger(ledger_db: Database) -> BudgetLedger:
    return BudgetLedger(ledger_db)


@pytest.fixture
def budget_state(backend: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A state directory whose stores are on `backend`: SQLite files in it, or a fresh Postgres
    named by `SWITCHYARD_DATABASE_URL`. For what opens the ledger by state directory (the CLI);
    the test opens it the same way, `open_store(state, Store.LEDGER)`."""
    from switchyard.db.schemas import store_schemas  # here: it imports every store (audit's takes ~2 s)

    state = tmp_path / "state"
    monkeypatch.delenv(DATABASE_URL_ENV, raising=False)
    monkeypatch.delenv(LEDGER_URL_ENV, raising=False)
    # Every store's schema: the CLI opens the API keys (and `audit drain` the audit store) too.
    for name, value in shared_state_env(backend, *store_schemas().values()).items():
        monkeypatch.setenv(name, value)
    return state


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
