"""One gateway replica as its own process, for the kill tests: the gateway's HTTP app with the
audit package's redactor and sink, the real leased budget gate over the SQLite ledger in the
state directory (with its charge journal, the spool named after it, as the Serve app wires
them), fake in-process providers, served by uvicorn.

Faults on request: a stream whose input says `[stall:<step>]` stops for good at that step of
its settlement (`settle`: before its charge is journaled; `restate`: charged, its stand-in not
yet restated; `record`: before its own record is written) and creates `STATE_DIR/stalled/<id>`,
so a test can kill the replica exactly there.

Usage: python _audit_gateway_replica.py POLICIES_DIR STATE_DIR PORT [RECOVER_EVERY_S]
(how often the replica looks for what dead replicas left; default the Serve app's)
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import uvicorn
from fastapi import FastAPI

from switchyard.audit.gateway import gateway_audit_parts
from switchyard.audit.sink import StoreAuditSink
from switchyard.budgets.admission import Admissions
from switchyard.budgets.charge_journal import ChargeJournal, ChargesOnHost, journal_dir, journal_name
from switchyard.budgets.leased_gate import LeasedBudgetGate
from switchyard.budgets.ledger import BudgetLedger
from switchyard.budgets.service import InProcessLedgerClient, LedgerService
from switchyard.db.engine import open_database
from switchyard.db.location import ledger_url
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.host_recovery import RECOVER_EVERY_S, HostRecovery
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import Completion, Delta, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.seams import Bill, Exchange, Reservation, Usage
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


class Stalls:
    """Stops a marked stream's settlement at one step for good (the replica is killed there)."""

    def __init__(self, state: Path) -> None:
        self.marked: dict[str, str] = {}  # request id -> the step it stalls at
        self.directory = state / "stalled"

    def mark(self, stand_in: Exchange) -> None:
        text = json.dumps(stand_in.input_messages)
        for step in ("settle", "restate", "record"):
            if f"[stall:{step}]" in text:
                self.marked.setdefault(stand_in.ctx.request_id, step)

    async def at(self, step: str, request_id: str) -> None:
        if self.marked.get(request_id) == step:
            self.directory.mkdir(exist_ok=True)
            (self.directory / request_id).touch()
            await asyncio.Event().wait()


def with_stalls(stalls: Stalls, sink: StoreAuditSink, budget: LeasedBudgetGate) -> None:
    open_stream, record, settle = sink.open_stream, sink.record, budget.settle
    opened: set[str] = set()

    async def stalling_open_stream(stand_in: Exchange, durable: bool) -> None:
        rid = stand_in.ctx.request_id
        if rid in opened:  # the stand-in restated, after the charge
            await stalls.at("restate", rid)
        opened.add(rid)
        stalls.mark(stand_in)
        await open_stream(stand_in, durable)

    async def stalling_record(
        exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        await stalls.at("record", exchange.ctx.request_id)
        await record(exchange, durable, within_s=within_s, withholds=withholds)

    async def stalling_settle(reservation: Reservation, bills: Sequence[Bill]) -> None:
        await stalls.at("settle", reservation.reservation_id)
        await settle(reservation, bills)

    sink.open_stream = stalling_open_stream  # type: ignore[method-assign]
    sink.record = stalling_record  # type: ignore[method-assign]
    budget.settle = stalling_settle  # type: ignore[method-assign]


def main(policies: Path, state: Path, port: int, recover_every_s: float) -> None:
    store = PolicyStore(policies, state)
    keys = KeyStore.in_state_dir(state)
    holder = f"replica-{os.getpid()}"
    ledger = BudgetLedger(open_database(ledger_url(state)))
    sink, redactor = gateway_audit_parts(
        store, state, writer=journal_name(holder), ledger=ChargesOnHost(journal_dir(state), ledger.charges_of)
    )
    metrics = InMemoryMetrics()
    budget = LeasedBudgetGate(
        Admissions(lambda: store.current),
        InProcessLedgerClient(LedgerService(ledger)),
        holder,
        journal=ChargeJournal(journal_dir(state), holder),
    )
    with_stalls(Stalls(state), sink, budget)
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

    recovery = HostRecovery(budget, sink, recover_every_s)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # As the Serve app does: a dead replica's journaled charges first, then its audit spool
        # (its cut-off streams at what they were charged); then again every `recover_every_s`.
        await recovery.recover()
        recovery.start()
        yield
        await recovery.stop()
        await budget.aclose()
        await sink.close()

    uvicorn.run(create_app(lambda: pipeline, lifespan=lifespan), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(
        Path(sys.argv[1]),
        Path(sys.argv[2]),
        int(sys.argv[3]),
        float(sys.argv[4]) if len(sys.argv) > 4 else RECOVER_EVERY_S,
    )
