"""Infrastructure faults before the first attempt (issue "money and audit", finding 7): the
ledger down or hung answers 503 with Retry-After within the deadline, charges nothing and
calls no provider; the refusal is audited. The real leased gate on a real ledger, SQLite or
Postgres."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from typing import Any

import httpx
import psycopg
import pytest
from gw_fakes import FakeUpstreams
from gw_harness import Harness

from switchyard.budgets.admission import Admissions
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import Database
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import (
    Claim,
    IdempotencyUnavailable,
    InMemoryIdempotencyStore,
    StoredResponse,
)

pytestmark = pytest.mark.asyncio(loop_scope="session")

CHAT = {"model": "auto", "messages": [{"role": "user", "content": "hello"}]}


def _leased_gate(gw: Harness, db: Database) -> tuple[LeasedBudgetGate, LedgerService]:
    service = LedgerService(BudgetLedger(db))
    gate = LeasedBudgetGate(Admissions(lambda: gw.store.current), InProcessLedgerClient(service), "test-holder")
    gw.parts.budget = gate
    return gate, service


async def _post(gw: Harness, headers: dict[str, str] | None = None) -> httpx.Response:
    app = create_app(lambda: gw.pipeline)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        return await client.post(
            "/v1/chat/completions", json=CHAT, headers={"authorization": f"Bearer {gw.keys['qa']}", **(headers or {})}
        )


def _database_down(db: Database) -> Exception:
    """What the ledger's own backend raises when it cannot answer."""
    if db.dialect == "sqlite":
        return sqlite3.OperationalError("database is locked")
    return psycopg.OperationalError("connection failed: Connection refused")


async def test_ledger_database_down_is_503_and_charges_nothing(
    gw: Harness, upstreams: FakeUpstreams, ledger_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, service = _leased_gate(gw, ledger_db)

    def down(*args: Any) -> Any:
        raise _database_down(ledger_db)

    monkeypatch.setattr(service, "admit", down)
    before = len(gw.audit.exchanges)
    resp = await _post(gw)
    assert resp.status_code == 503, resp.text
    assert resp.json()["error"]["code"] == "budget_unavailable" and resp.headers["retry-after"] == "1"
    assert upstreams.openai.received == [], "a provider was called without money held for it"
    records = list(gw.audit.exchanges)[before:]
    assert [r.status_code for r in records] == [503] and records[0].cost_usd == 0
    await gate.aclose()


async def test_hung_ledger_answers_within_the_deadline(
    gw: Harness, upstreams: FakeUpstreams, ledger_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate, _ = _leased_gate(gw, ledger_db)
    client = gate.client

    async def hangs(*args: Any) -> Any:
        await asyncio.sleep(3600)

    monkeypatch.setattr(client, "admit", hangs)
    started = time.monotonic()
    resp = await _post(gw, {"x-switchyard-deadline-ms": "300"})
    took = time.monotonic() - started
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "budget_unavailable"
    assert took < 1.0, f"a hung ledger held the request {took:.2f} s past a 300 ms deadline"
    assert upstreams.openai.received == []
    await gate.aclose()


class _FlakyStore:
    """An idempotency store whose calls fail while `down` (a dead or restarting store)."""

    def __init__(self) -> None:
        self.inner = InMemoryIdempotencyStore()
        self.down: set[str] = set()  # names of the methods that fail now

    def _check(self, method: str) -> None:
        if method in self.down:
            raise IdempotencyUnavailable(f"{method}: the idempotency store is unreachable")

    async def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        self._check("claim")
        return await self.inner.claim(scope, key, body_hash)

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        self._check("complete")
        await self.inner.complete(scope, key, response)

    async def abandon(self, scope: str, key: str) -> None:
        self._check("abandon")
        await self.inner.abandon(scope, key)

    async def purge_subject(self, scope: str, subject: str) -> int:
        return await self.inner.purge_subject(scope, subject)


async def test_idempotency_store_down_before_the_claim_is_503_and_runs_nothing(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    store = _FlakyStore()
    store.down.add("claim")
    gw.parts.idempotency = store
    resp = await _post(gw, {"idempotency-key": "k-down"})
    assert resp.status_code == 503 and resp.json()["error"]["code"] == "idempotency_unavailable"
    assert upstreams.openai.received == [] and not gw.budget.held


async def test_a_failed_store_after_a_charged_success_does_not_make_the_retry_pay_again(
    gw: Harness, upstreams: FakeUpstreams
) -> None:
    store = _FlakyStore()
    store.down.add("complete")
    gw.parts.idempotency = store
    first = await _post(gw, {"idempotency-key": "k-flaky"})
    assert first.status_code == 200, "the answer was produced and paid for: it is returned"
    store.down.clear()  # the store is back; the answer is stored in the background
    retry = await _post(gw, {"idempotency-key": "k-flaky"})
    assert retry.status_code == 200 and retry.json()["id"] == first.json()["id"]
    assert retry.headers.get("x-switchyard-idempotent-replay") == "true"
    assert len(upstreams.openai.received) == 1, "the client's retry ran (and was charged) again"
