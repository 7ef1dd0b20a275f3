"""One gateway replica as its own process, for the kill test: the gateway's HTTP app with the
audit package's redactor and sink, the real leased budget gate over the SQLite ledger in the
state directory (with its charge journal), fake in-process providers, served by uvicorn.

Usage: python _audit_gateway_replica.py POLICIES_DIR STATE_DIR PORT
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from switchyard.audit.gateway import gateway_audit_parts
from switchyard.budgets.admission import Admissions
from switchyard.budgets.charge_journal import ChargeJournal
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import open_database
from switchyard.db.location import ledger_url
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import Completion, Delta, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.seams import Usage
from switchyard.policy.keys import KeyStore
from switchyard.policy.store import PolicyStore


async def answer(call: ProviderCall) -> Completion:
    await asyncio.sleep(0.005)
    text = json.dumps(call.messages)
    if "<EMAIL_ADDRESS_1>" in text:
        reply = "We wrote to <EMAIL_ADDRESS_1>."
    else:
        reply = json.dumps({"escalate": False, "reason": "routine"})
    return Completion(reply, Usage(len(text) // 4, 8), "stop", call.model_version)


HOLD = "[hold]"  # a stream whose input says this stops after its first piece, until the replica dies


class HoldingProvider(InProcessProvider):
    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        pieces = super().stream(call)
        yield await anext(pieces)
        if HOLD in json.dumps(call.messages):
            await asyncio.Event().wait()
        async for piece in pieces:
            yield piece


def main(policies: Path, state: Path, port: int) -> None:
    store = PolicyStore(policies, state)
    keys = KeyStore.in_state_dir(state)
    sink, redactor = gateway_audit_parts(store, state)
    metrics = InMemoryMetrics()
    holder = f"replica-{os.getpid()}"
    budget = LeasedBudgetGate(
        Admissions(lambda: store.current),
        InProcessLedgerClient(LedgerService(BudgetLedger(open_database(ledger_url(state))))),
        holder,
        journal=ChargeJournal(state / "budgets" / "journal", holder),
    )
    parts = GatewayParts(
        policies=lambda: store.current,
        keys=KeySnapshot(keys.verifier(), keys.version()),
        providers=ProviderPool(overrides={n: HoldingProvider(n, answer) for n in ("openai", "anthropic", "bedrock")}),
        budget=budget,
        redactor=redactor,
        audit=sink,
        metrics=metrics,
        idempotency=InMemoryIdempotencyStore(),
        circuits=CircuitBoard(on_change=metrics.circuit_changed),
    )
    pipeline = ChatPipeline(parts)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await budget.recover()  # as the Serve app does: a dead replica's journaled charges first
        yield
        await budget.aclose()
        await sink.close()

    uvicorn.run(create_app(lambda: pipeline, lifespan=lifespan), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
