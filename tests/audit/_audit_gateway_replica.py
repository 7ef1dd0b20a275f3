"""One gateway replica as its own process, for the kill test: the gateway's HTTP app with the
audit package's redactor and sink, fake in-process providers, served by uvicorn.

Usage: python _audit_gateway_replica.py POLICIES_DIR STATE_DIR PORT
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import uvicorn

from switchyard.audit.gateway import gateway_audit_parts
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import CircuitBoard
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.interim import InMemoryBudgetGate
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import Completion, ProviderCall
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


def main(policies: Path, state: Path, port: int) -> None:
    store = PolicyStore(policies, state)
    keys = KeyStore.in_state_dir(state)
    sink, redactor = gateway_audit_parts(store, state)
    metrics = InMemoryMetrics()
    parts = GatewayParts(
        policies=lambda: store.current,
        keys=KeySnapshot(keys.verifier(), keys.mtime()),
        providers=ProviderPool(overrides={n: InProcessProvider(n, answer) for n in ("openai", "anthropic", "bedrock")}),
        budget=InMemoryBudgetGate(store.current),
        redactor=redactor,
        audit=sink,
        metrics=metrics,
        idempotency=InMemoryIdempotencyStore(),
        circuits=CircuitBoard(on_change=metrics.circuit_changed),
    )
    pipeline = ChatPipeline(parts)
    uvicorn.run(create_app(lambda: pipeline), host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3]))
