"""An in-process gateway wired to the fake upstreams, with the shipped policies plus a test team.

`make_policies` copies `policies/`, points providers.yaml at the fake upstreams and adds
`teams/qa.yaml` (flows that exercise compliance filtering, repair and no-fallback rules).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import openai
import yaml

from switchyard.gateway.attempts import RetryPolicy
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.circuit import BreakerSettings, CircuitBoard
from switchyard.gateway.eval_signing import EvalSigner
from switchyard.gateway.evalbook import EvalBook
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import IdempotencyStore, InMemoryIdempotencyStore
from switchyard.gateway.interim import CollectingAuditSink, InMemoryBudgetGate, PassthroughRedactor
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import ChatProvider, Completion, ProviderCall
from switchyard.gateway.providers.inprocess import InProcessProvider
from switchyard.gateway.seams import Usage
from switchyard.gateway.tracing import GatewayTracing
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import Role
from switchyard.policy.store import PolicyStore

REPO = Path(__file__).resolve().parents[2]

QA_TEAM = {
    "team": "qa",
    "description": "Test team: flows that exercise the gateway's routing rules.",
    "default_flow": "plain",
    "allowed_providers": ["openai", "anthropic", "bedrock", "local"],
    "flows": {
        "plain": {
            "prompt": "assistant@1",
            "model": "gpt-4o-mini",
            "fallback": [{"model": "claude-haiku"}],
            "deadline_ms": 5000,
        },
        "notes": {
            "prompt": "assistant@1",
            "data_class": "regulated",
            "model": "bedrock-claude-sonnet",
            "fallback": [{"model": "claude-haiku"}, {"model": "local-gpt"}],
        },
        "strict-json": {
            "prompt": "assistant@1",
            "model": "gpt-4o-mini",
            "fallback": [{"model": "claude-haiku"}],
            "output_schema": {
                "type": "object",
                "required": ["answer"],
                "properties": {"answer": {"type": "string"}},
                "additionalProperties": False,
            },
        },
        "only-5xx": {
            "prompt": "assistant@1",
            "model": "gpt-4o-mini",
            "fallback": [{"model": "claude-haiku", "on_errors": ["server_error"]}],
        },
        "filtered": {
            "prompt": "assistant@1",
            "model": "gpt-4o-mini",
            "fallback": [{"model": "claude-haiku", "on_errors": ["content_filter", "context_length"]}],
        },
        "closed": {"prompt": "assistant@1", "model": "gpt-4o-mini", "allow_free_messages": False},
        # Tool calling: the local model cannot call tools, so a tool request skips it visibly.
        "agent": {
            "prompt": "assistant@1",
            "model": "gpt-4o-mini",
            "fallback": [{"model": "local-gpt"}, {"model": "claude-haiku"}],
            "deadline_ms": 5000,
            "budget": {"day_usd": 50},
        },
        # Bedrock takes image bytes only: an https image skips it, a data URL does not.
        "vision": {
            "prompt": "assistant@1",
            "model": "bedrock-claude-sonnet",
            "fallback": [{"model": "claude-haiku"}],
            "deadline_ms": 5000,
        },
        "local-only": {"prompt": "assistant@1", "model": "local-gpt", "deadline_ms": 5000},
        "vectors": {"prompt": "assistant@1", "model": "local-embed", "deadline_ms": 20000},
        "private": {"prompt": "assistant@1", "model": "gpt-4o-mini", "data_class": "personal"},
    },
}

PAYMENT_SUITE = {
    "description": "Dispute triage: escalate fraud and large amounts, not routine questions.",
    "cases": [
        {
            "name": "fraud",
            "variables": {"dispute_id": "D-1", "summary": "card stolen, 3 charges"},
            "expect_json": {"escalate": True},
        },
        {
            "name": "routine",
            "variables": {"dispute_id": "D-2", "summary": "asks for a receipt"},
            "expect_json": {"escalate": False},
        },
    ],
}


def make_policies(dest: Path, upstream_base: str) -> Path:
    shutil.copytree(REPO / "policies", dest)
    if not (dest / "scheduler.yaml").exists():
        # The scheduler's policy file is another area's; an empty one means "defaults".
        (dest / "scheduler.yaml").write_text("")
    providers = yaml.safe_load((dest / "providers.yaml").read_text())
    for name in ("openai", "azure-openai"):
        providers["providers"][name]["base_url"] = f"{upstream_base}/v1"
    providers["providers"]["anthropic"]["base_url"] = upstream_base
    providers["providers"]["bedrock"]["base_url"] = upstream_base
    for spec in providers["providers"].values():
        spec["timeout_s"] = 5
    providers["providers"]["openai"]["timeout_s"] = 0.5  # a slow primary times out fast in tests
    (dest / "providers.yaml").write_text(yaml.safe_dump(providers))
    (dest / "teams" / "qa.yaml").write_text(yaml.safe_dump(QA_TEAM))
    suites = dest / "evals" / "suites"
    suites.mkdir(parents=True, exist_ok=True)
    if not (suites / "payment-risk.yaml").exists():
        (suites / "payment-risk.yaml").write_text(yaml.safe_dump(PAYMENT_SUITE))
    return dest


def make_keys(state: Path) -> dict[str, str]:
    store = KeyStore.in_state_dir(state)
    keys = {team: store.create(team, Role.MEMBER)[0] for team in ("support", "payments", "qa", "demo")}
    keys["auditor"] = store.create("platform", Role.AUDITOR)[0]
    keys["operator"] = store.create("platform", Role.PLATFORM_ADMIN)[0]
    revoked, record = store.create("qa", Role.MEMBER)
    store.revoke(record.key_id)
    keys["revoked"] = revoked
    return keys


class SteppedWallClock:
    """`time.time()` as an NTP step or a resumed VM moves it: plus `step_s` from its
    `after + 1`-th reading on (`GatewayParts.clock`; `test_gw_clock_steps.py`)."""

    def __init__(self, step_s: float, after: int) -> None:
        self.step_s, self.after, self.readings = step_s, after, 0

    def __call__(self) -> float:
        self.readings += 1
        return time.time() + (self.step_s if self.readings > self.after else 0.0)


async def local_echo(call: ProviderCall) -> Completion:
    last = call.messages[-1]["content"] if call.messages else ""
    return Completion(f"local says: {last[:40]}", Usage(len(last) // 4 + 1, 5), "stop", call.model_version)


@dataclass
class Harness:
    pipeline: ChatPipeline
    parts: GatewayParts
    metrics: InMemoryMetrics
    audit: CollectingAuditSink
    budget: InMemoryBudgetGate
    keys: dict[str, str]
    local: InProcessProvider
    store: PolicyStore
    clients: list[httpx.AsyncClient] = field(default_factory=list)

    def client(self, team: str = "qa", **kw: Any) -> openai.AsyncOpenAI:
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(lambda: self.pipeline)), base_url="http://gateway"
        )
        self.clients.append(http)
        return openai.AsyncOpenAI(
            base_url="http://gateway/v1", api_key=self.keys[team], http_client=http, max_retries=0, **kw
        )

    def raw(self) -> httpx.AsyncClient:
        http = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=create_app(lambda: self.pipeline)), base_url="http://gateway"
        )
        self.clients.append(http)
        return http

    async def status(self) -> dict[str, Any]:
        """The health detail, read as an operator reads it (it needs a platform-admin key)."""
        answer = await self.raw().get(
            "/v1/switchyard/status", headers={"authorization": f"Bearer {self.keys['operator']}"}
        )
        assert answer.status_code == 200, answer.text
        body: dict[str, Any] = answer.json()
        return body

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()
        await self.pipeline.aclose()
        await self.parts.providers.aclose()


def build_harness(
    policies: Path,
    state: Path,
    keys: dict[str, str],
    *,
    idempotency: IdempotencyStore | None = None,
    breaker: BreakerSettings | None = None,
    overrides: dict[str, ChatProvider] | None = None,
    fail_durable_audit: bool = False,
    tracing: GatewayTracing | None = None,
) -> Harness:
    store = PolicyStore(policies, state)
    ks = KeyStore.in_state_dir(state)
    metrics = InMemoryMetrics()
    audit = CollectingAuditSink(fail_durable=fail_durable_audit)
    budget = InMemoryBudgetGate(store.current)
    local = InProcessProvider("local", local_echo)
    parts = GatewayParts(
        policies=lambda: store.current,
        keys=KeySnapshot(ks.verifier(), ks.version()),
        providers=ProviderPool(overrides={"local": local, **(overrides or {})}),
        budget=budget,
        redactor=PassthroughRedactor(store.current, strict=False),
        audit=audit,
        metrics=metrics,
        idempotency=idempotency or InMemoryIdempotencyStore(),
        circuits=CircuitBoard(breaker or BreakerSettings(), on_change=metrics.circuit_changed),
        retry=RetryPolicy(base_backoff_s=0.001, max_backoff_s=0.01),
        evals=EvalBook(EvalSigner.in_state_dir(state)),
        tracing=tracing or GatewayTracing(),
    )
    return Harness(ChatPipeline(parts), parts, metrics, audit, budget, keys, local, store)
