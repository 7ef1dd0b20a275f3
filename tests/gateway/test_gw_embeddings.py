"""`/v1/embeddings` end to end: the official `openai` SDK against the embeddings pipeline served
by uvicorn on 127.0.0.1, with the real Presidio redactor and the SQLite audit sink, in front of
fake OpenAI and Bedrock (Titan v2) upstreams and the local model on CPU. No Ray.

The HTTP route is mounted here on a small FastAPI app (`embeddings_app`), written as
`switchyard.gateway.http` mounts chat: authenticate from the headers, read the capped body,
hand both to `EmbeddingsPipeline.handle`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
import pytest
import uvicorn
import yaml
from fastapi import FastAPI
from gw_fake_embeddings import FakeEmbeddingUpstreams, Fault, fake_tokens, fake_vector
from gw_harness import SteppedWallClock, make_policies
from gw_server import loopback_listener

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.record import RequestRecord
from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.spool import AuditSpool
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring, unseal
from switchyard.gateway.attempts import RetryPolicy
from switchyard.gateway.auth import KeySnapshot
from switchyard.gateway.embeddings import EmbeddingsPipeline, input_tokens_bound
from switchyard.gateway.http import create_app
from switchyard.gateway.idempotency import InMemoryIdempotencyStore
from switchyard.gateway.interim import InMemoryBudgetGate
from switchyard.gateway.local_model import EmbeddingInputError, LocalChatModel
from switchyard.gateway.metrics import InMemoryMetrics
from switchyard.gateway.pipeline import ChatPipeline, GatewayParts
from switchyard.gateway.pool import ProviderPool
from switchyard.gateway.providers.base import EmbeddingCall, Embeddings, ProviderError
from switchyard.gateway.providers.bedrock_embeddings import BedrockEmbeddingsProvider
from switchyard.gateway.providers.embedding_registry import EmbedderPool, UnreachableEmbedder, build_embedder
from switchyard.gateway.providers.openai_embeddings import OpenAIEmbeddingsProvider, parse_embeddings, request_body
from switchyard.gateway.seams import Exchange
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import BodyStorage, Credential, ErrorClass, Provider, ProviderKind, Role
from switchyard.policy.store import PolicyStore

pytestmark = pytest.mark.asyncio(loop_scope="session")

EMAIL = "jane.doe@example.com"
PHONE = "+1 415-555-0132"
CUSTOMER = f"Customer {EMAIL} (phone {PHONE}) asked about refunds."
NANOS_PER_TOKEN = 20  # text-embedding-3-small and titan-embed-v2: $0.02 per million tokens

RECS_TEAM = {
    "team": "recs",
    "description": "Test team: search and recommendation embeddings.",
    "default_flow": "index",
    "allowed_providers": ["openai", "bedrock", "local"],
    "flows": {
        "index": {
            "prompt": "assistant@1",  # flows name a prompt; embeddings render none
            "model": "text-embedding-3-small",
            "allowed_models": ["titan-embed-v2", "local-embed", "gpt-4o-mini"],
            "fallback": [{"model": "titan-embed-v2"}],  # ignored for embeddings: never a fallback
            "deadline_ms": 5000,
        },
        "customers": {"prompt": "assistant@1", "model": "text-embedding-3-small", "data_class": "personal"},
        "patients": {"prompt": "assistant@1", "model": "titan-embed-v2", "data_class": "regulated"},
        "tight": {"prompt": "assistant@1", "model": "text-embedding-3-small", "budget": {"day_usd": 0.0000001}},
        "chat": {"prompt": "assistant@1", "model": "gpt-4o-mini"},
        "ledger": {"prompt": "assistant@1", "model": "text-embedding-3-small", "risk_tier": "high"},
    },
}


class RecordingMetrics(InMemoryMetrics):
    """Counts what was charged per model (`GatewayMetrics.usage`), as the Ray adapter would."""

    def __init__(self) -> None:
        super().__init__()
        self.usages: list[tuple[str, str, str, int, int, float]] = []

    def usage(self, team: str, flow: str, model: str, prompt_tokens: int, completion_tokens: int, usd: float) -> None:
        self.usages.append((team, flow, model, prompt_tokens, completion_tokens, usd))


class TeeAuditSink:
    """The SQLite sink, plus the exchanges it was handed (to check what reaches the builder)."""

    def __init__(self, sink: StoreAuditSink) -> None:
        self.sink = sink
        self.exchanges: list[Exchange] = []

    async def record(
        self, exchange: Exchange, durable: bool, *, within_s: float | None = None, withholds: bool = False
    ) -> None:
        self.exchanges.append(exchange)
        await self.sink.record(exchange, durable, within_s=within_s, withholds=withholds)

    async def open_stream(self, stand_in: Exchange, durable: bool) -> None:
        await self.sink.open_stream(stand_in, durable)


class InProcessLocalEmbedder:
    """The `local` provider without Serve: what `ServeHandleProvider.embed` sends and parses,
    answered by `LocalChatModel.embeddings` as the deployment answers it."""

    def __init__(self, model: LocalChatModel) -> None:
        self.name = "local"
        self.model = model

    async def embed(self, call: EmbeddingCall) -> Embeddings:
        payload = {**request_body(call), "request_id": call.request_id}
        return parse_embeddings(self.name, await asyncio.to_thread(self.model.embeddings, payload), call)


def embeddings_app(pipeline: EmbeddingsPipeline, chat: ChatPipeline) -> FastAPI:
    """The gateway's own app, with `POST /v1/embeddings` mounted as Serve mounts it."""
    return create_app(lambda: chat, embeddings=lambda: pipeline)


class _InLoopServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the test runner keeps its own signal handlers


@dataclass
class EmbeddingGateway:
    url: str
    key: str
    pipeline: EmbeddingsPipeline
    parts: GatewayParts
    fakes: FakeEmbeddingUpstreams
    metrics: RecordingMetrics
    audit: TeeAuditSink
    budget: InMemoryBudgetGate
    store: AuditStore
    keyring: SubjectKeyring
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    def client(self) -> openai.AsyncOpenAI:
        client = openai.AsyncOpenAI(base_url=f"{self.url}/v1", api_key=self.key, max_retries=0)
        self.clients.append(client)
        return client

    def headers(self, flow: str | None = None) -> dict[str, str]:
        out = {"authorization": f"Bearer {self.key}"}
        if flow is not None:
            out["x-switchyard-flow"] = flow
        return out

    def record(self, request_id: str) -> RequestRecord:
        found = [e.entry for e in self.store.find(team="recs", limit=10_000) if e.entry.request_id == request_id]
        assert len(found) == 1, f"{len(found)} audit records for {request_id}"
        assert isinstance(found[0], RequestRecord)
        return found[0]

    def stored_input(self, record: RequestRecord) -> str:
        data = self.store.body(record.request_id, "input")
        assert data is not None and record.input.key_id is not None
        return unseal(self.keyring.key_by_id(record.input.key_id), data, f"{record.request_id}/input")


@pytest.fixture(scope="module")
async def egw(tmp_path_factory: pytest.TempPathFactory, gw_env: None) -> AsyncIterator[EmbeddingGateway]:
    fakes = FakeEmbeddingUpstreams()
    fakes.start()
    root = tmp_path_factory.mktemp("embeddings")
    policies = make_policies(root / "policies", fakes.base)
    (policies / "teams" / "recs.yaml").write_text(yaml.safe_dump(RECS_TEAM))
    state = root / "state"
    (state / "audit").mkdir(parents=True)
    store = PolicyStore(policies, state)
    keys = KeyStore.in_state_dir(state)
    key = keys.create("recs", Role.MEMBER)[0]
    scrubber = TextScrubber()
    keyring = SubjectKeyring.in_state_dir(state)
    audit_store = AuditStore.in_state_dir(state)
    # No spool: every record is committed before the answer, so a test reads it at once.
    sink = TeeAuditSink(StoreAuditSink(RecordBuilder(lambda: store.current.data, scrubber, keyring), audit_store, None))
    metrics = RecordingMetrics()
    budget = InMemoryBudgetGate(store.current)
    parts = GatewayParts(
        policies=lambda: store.current,
        keys=KeySnapshot(keys.verifier(), keys.version()),
        providers=ProviderPool(),
        budget=budget,
        redactor=PresidioRedactor(lambda: store.current.data, scrubber),
        audit=sink,
        metrics=metrics,
        idempotency=InMemoryIdempotencyStore(),
        retry=RetryPolicy(base_backoff_s=0.001, max_backoff_s=0.01),
    )
    embedders = EmbedderPool(overrides={"local": InProcessLocalEmbedder(LocalChatModel(None))})
    pipeline = EmbeddingsPipeline(parts, embedders)
    sock = loopback_listener()
    port = sock.getsockname()[1]
    chat = ChatPipeline(parts)
    config = uvicorn.Config(embeddings_app(pipeline, chat), log_level="warning", lifespan="off", access_log=False)
    server = _InLoopServer(config)
    serving = asyncio.get_running_loop().create_task(server.serve(sockets=[sock]))
    while not server.started:
        assert not serving.done(), "the gateway did not start"
        await asyncio.sleep(0.01)
    gw = EmbeddingGateway(
        f"http://127.0.0.1:{port}", key, pipeline, parts, fakes, metrics, sink, budget, audit_store, keyring
    )
    yield gw
    for client in gw.clients:
        await client.close()
    server.should_exit = True
    await serving
    await pipeline.aclose()
    await chat.aclose()
    await parts.providers.aclose()
    audit_store.close()
    fakes.stop()


@pytest.fixture
def gw(egw: EmbeddingGateway) -> EmbeddingGateway:
    egw.fakes.reset()
    return egw


def _usd(tokens: int) -> float:
    return tokens * NANOS_PER_TOKEN / 1e9


# ---------------------------------------------------------------- answers


async def test_float_vectors_through_the_sdk(gw: EmbeddingGateway) -> None:
    texts = ["red running shoes", "a waterproof jacket", "red running shoes"]
    raw = await gw.client().embeddings.with_raw_response.create(
        model="auto", input=texts, encoding_format="float", user="shopper-7"
    )
    done = raw.parse()
    assert [d.embedding for d in done.data] == [fake_vector(t, 1536) for t in texts]  # exactly what the model made
    assert [d.index for d in done.data] == [0, 1, 2] and done.model == "text-embedding-3-small"
    tokens = sum(fake_tokens(t) for t in texts)
    assert done.usage.prompt_tokens == done.usage.total_tokens == tokens  # the provider's count
    h = raw.headers
    assert h["x-switchyard-provider"] == "openai" and h["x-switchyard-model"] == "text-embedding-3-small"
    assert h["x-switchyard-fallback"] == "none" and len(h["x-switchyard-request-id"]) == 32
    assert h["x-switchyard-cost-usd"] == f"{_usd(tokens):.8f}"
    sent = gw.fakes.openai.received[-1]
    assert sent == {"model": "text-embedding-3-small", "input": texts, "encoding_format": "float"}  # no `user`
    assert gw.metrics.usages[-1] == ("recs", "index", "text-embedding-3-small", tokens, 0, _usd(tokens))
    record = gw.record(h["x-switchyard-request-id"])
    assert record.status_code == 200 and record.tokens is not None and record.tokens.prompt == tokens
    assert record.cost_usd == _usd(tokens) and record.budget_decision == "reserved"
    assert not gw.budget.held  # settled: nothing is left on hold


async def test_base64_is_little_endian_float32_the_sdk_decodes(gw: EmbeddingGateway) -> None:
    # Without `encoding_format` the SDK asks for base64 and decodes it itself.
    done = await gw.client().embeddings.create(model="text-embedding-3-small", input="a waterproof jacket")
    got, want = done.data[0].embedding, fake_vector("a waterproof jacket", 1536)
    assert len(got) == 1536 and max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-6
    assert gw.fakes.openai.received[-1]["encoding_format"] == "float"  # the gateway encodes, not the upstream
    explicit = await gw.client().embeddings.create(model="auto", input="x", encoding_format="base64")
    assert isinstance(explicit.data[0].embedding, str)  # asked for base64 by name: the SDK leaves it as sent


async def test_titan_on_bedrock_with_dimensions(gw: EmbeddingGateway) -> None:
    texts = ["hiking boots", "trail map"]
    raw = await gw.client().embeddings.with_raw_response.create(
        model="titan-embed-v2", input=texts, dimensions=256, encoding_format="float"
    )
    done = raw.parse()
    assert [d.embedding for d in done.data] == [fake_vector(t, 256) for t in texts]
    assert done.usage.prompt_tokens == sum(fake_tokens(t) for t in texts)
    calls = sorted(gw.fakes.bedrock.received, key=lambda r: r["inputText"])
    assert calls == [
        {"modelId": "amazon.titan-embed-text-v2:0", "inputText": t, "dimensions": 256, "normalize": True}
        for t in sorted(texts)
    ]  # one call per input, each a valid InvokeModel + Titan body
    assert raw.headers["x-switchyard-provider"] == "bedrock" and not gw.fakes.bedrock.rejected


async def test_local_model_through_the_gateway(gw: EmbeddingGateway) -> None:
    texts = ["hello", "héllo wörld"]
    done = await gw.client().embeddings.create(model="local-embed", input=texts, encoding_format="float")
    assert [len(d.embedding) for d in done.data] == [64, 64]
    assert all(abs(sum(x * x for x in d.embedding) - 1) < 1e-5 for d in done.data)
    assert done.usage.prompt_tokens == sum(len(t.encode()) for t in texts)  # bytes: exact
    with pytest.raises(openai.BadRequestError) as err:  # refused by the model, not truncated
        await gw.client().embeddings.create(model="local-embed", input="x" * 200)
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "context_length_exceeded"


# ---------------------------------------------------------------- governance


async def test_a_budget_that_cannot_fit_is_402_and_the_upstream_is_never_called(gw: EmbeddingGateway) -> None:
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client().embeddings.create(model="auto", input="x" * 100, extra_headers={"x-switchyard-flow": "tight"})
    assert err.value.status_code == 402
    assert isinstance(err.value.body, dict) and err.value.body["code"] == "over_budget"
    assert gw.fakes.openai.received == []
    record = gw.record(err.value.response.headers["x-switchyard-request-id"])
    assert record.status_code == 402 and record.budget_decision.startswith("over_budget:") and record.attempts == ()
    assert record.cost_usd == 0 and err.value.response.headers["x-switchyard-cost-usd"] == "0.00000000"


async def test_a_redacted_class_sends_and_stores_redacted_text(gw: EmbeddingGateway) -> None:
    raw = await gw.client().embeddings.with_raw_response.create(
        model="auto", input=[CUSTOMER, "plain text"], extra_headers={"x-switchyard-flow": "customers"}
    )
    assert len(raw.parse().data) == 2
    sent = gw.fakes.openai.received[-1]["input"]
    assert "<EMAIL_ADDRESS_1>" in sent[0] and "<PHONE_NUMBER_1>" in sent[0] and sent[1] == "plain text"
    assert EMAIL not in json.dumps(sent) and PHONE not in json.dumps(sent)
    record = gw.record(raw.headers["x-switchyard-request-id"])
    assert record.redaction.mode == "reversible" and record.redaction.entity_counts["EMAIL_ADDRESS"] == 1
    assert record.input.storage is BodyStorage.REDACTED and record.output.storage is BodyStorage.NONE
    stored = json.loads(gw.stored_input(record))  # the inputs as messages, redacted as `personal` stores prompts
    assert stored[1] == {"role": "user", "content": "plain text"}
    assert "<EMAIL_ADDRESS>" in stored[0]["content"] and EMAIL not in stored[0]["content"]


async def test_an_irreversible_class_on_bedrock_stores_a_hash(gw: EmbeddingGateway) -> None:
    raw = await gw.client().embeddings.with_raw_response.create(
        model="auto", input=CUSTOMER, extra_headers={"x-switchyard-flow": "patients"}
    )
    assert raw.headers["x-switchyard-provider"] == "bedrock"
    sent = gw.fakes.bedrock.received[-1]["inputText"]
    assert "<EMAIL_ADDRESS>" in sent and EMAIL not in sent  # `regulated` redacts irreversibly
    record = gw.record(raw.headers["x-switchyard-request-id"])
    assert record.redaction.mode == "irreversible" and record.input.storage is BodyStorage.HASH
    assert record.input.digest is not None and gw.store.body(record.request_id, "input") is None


async def test_one_record_per_request_and_no_vector_in_it(gw: EmbeddingGateway, tmp_path: Path) -> None:
    gw.fakes.openai.faults.append(Fault("status", status=400, error_type="invalid_request_error"))
    client = gw.client()
    ids: list[str] = []
    vectors: list[list[float]] = []
    for i in range(6):
        try:
            raw = await client.embeddings.with_raw_response.create(
                model="auto", input=[f"query {i}", f"doc {i}"], encoding_format="float"
            )
        except openai.BadRequestError as exc:  # the first: the upstream refused it
            ids.append(exc.response.headers["x-switchyard-request-id"])
            continue
        ids.append(raw.headers["x-switchyard-request-id"])
        vectors += [d.embedding for d in raw.parse().data]
    found = Counter(e.entry.request_id for e in gw.store.find(team="recs", limit=10_000))
    assert all(found[i] == 1 for i in ids), found
    mine = [x for x in gw.audit.exchanges if x.ctx.request_id in ids]
    assert len(mine) == 6 and all(x.output_text is None for x in mine)
    assert [x.status_code for x in mine] == [400, 200, 200, 200, 200, 200]
    payloads = [e.entry.model_dump_json() for e in gw.store.find(team="recs", limit=10_000)]
    components = {repr(v[k]) for v in vectors for k in (0, 1, 100, 1535)}
    assert not any(c in p for c in components for p in payloads)  # vectors are not audited


@pytest.mark.parametrize("step_s", [-3_600.0, 3_600.0])
async def test_a_wall_clock_step_moves_no_deadline_and_no_latency(gw: EmbeddingGateway, step_s: float) -> None:
    """As for chat (`test_gw_clock_steps.py`): an hour forward was a 504 with no provider
    called, an hour back a latency of minus an hour in the audit record."""
    wall = gw.parts.clock
    gw.parts.clock = SteppedWallClock(step_s, after=1)
    try:
        began = time.perf_counter()
        raw = await gw.client().embeddings.with_raw_response.create(model="auto", input="a waterproof jacket")
        elapsed_ms = (time.perf_counter() - began) * 1000
    finally:
        gw.parts.clock = wall
    assert raw.status_code == 200
    [exchange] = [x for x in gw.audit.exchanges if x.ctx.request_id == raw.headers["x-switchyard-request-id"]]
    assert 0 <= exchange.latency_ms <= elapsed_ms
    assert all(0 <= a.latency_ms <= elapsed_ms for a in exchange.attempts)


async def test_a_chat_model_is_400_naming_model(gw: EmbeddingGateway) -> None:
    with pytest.raises(openai.BadRequestError) as err:
        await gw.client().embeddings.create(model="gpt-4o-mini", input="hi")  # allowed by the flow, but chat
    body = err.value.body
    assert isinstance(body, dict) and body["code"] == "not_an_embedding_model" and body["param"] == "model"
    with pytest.raises(openai.BadRequestError) as err:  # `auto` on a chat flow
        await gw.client().embeddings.create(model="auto", input="hi", extra_headers={"x-switchyard-flow": "chat"})
    assert isinstance(err.value.body, dict) and err.value.body["param"] == "model"
    with pytest.raises(openai.PermissionDeniedError):  # a model the flow does not allow
        await gw.client().embeddings.create(model="local-gpt", input="hi")
    assert gw.fakes.openai.received == []


@pytest.mark.parametrize(
    ("body", "code", "param"),
    [
        ({"input": [1, 2, 3]}, "token_input_unsupported", "input"),
        ({"input": [[1, 2], [3]]}, "token_input_unsupported", "input"),
        ({"input": ["ok", ""]}, "invalid_request", "input[1]"),
        ({"input": ""}, "invalid_request", "input"),
        ({"input": []}, "invalid_request", "input"),
        ({"input": [{"text": "hi"}]}, "invalid_request", "input"),
        ({"input": ["x"] * 2049}, "too_many_inputs", "input"),
        ({"input": "hi", "encoding_format": "int8"}, "invalid_request", "encoding_format"),
        ({"input": "hi", "dimensions": 0}, "invalid_request", "dimensions"),
        ({"input": "hi", "dimensions": 4096}, "dimensions_unsupported", "dimensions"),
        ({"input": "hi", "truncate": True}, "invalid_request", "truncate"),
    ],
)
async def test_request_errors_name_the_field(gw: EmbeddingGateway, body: dict[str, Any], code: str, param: str) -> None:
    result = await gw.pipeline.handle(json.dumps({"model": "auto", **body}).encode(), gw.headers())
    assert result.status == 400, result.body
    assert (result.body["error"]["code"], result.body["error"]["param"]) == (code, param)
    assert gw.fakes.openai.received == []


async def test_idempotency_key_is_refused_not_ignored(gw: EmbeddingGateway) -> None:
    headers = {**gw.headers(), "idempotency-key": "k-1"}
    result = await gw.pipeline.handle(b'{"model": "auto", "input": "hi"}', headers)
    assert result.status == 400 and result.body["error"]["param"] == "Idempotency-Key"


# ---------------------------------------------------------------- failures


async def test_a_retryable_failure_is_retried_once_on_the_same_model(gw: EmbeddingGateway) -> None:
    gw.fakes.openai.faults.append(Fault("status", status=500))
    done = await gw.client().embeddings.create(model="auto", input="retry me", encoding_format="float")
    assert done.data[0].embedding == fake_vector("retry me", 1536) and len(gw.fakes.openai.received) == 2


async def test_no_fallback_even_where_the_flow_lists_one(gw: EmbeddingGateway) -> None:
    gw.fakes.openai.faults.extend([Fault("status", status=503), Fault("status", status=503)])
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client().embeddings.create(model="auto", input="no fallback")
    assert err.value.status_code == 502 and "never fall back" in str(err.value.body)
    assert err.value.response.headers["x-switchyard-fallback"] == "none"
    assert len(gw.fakes.openai.received) == 2 and gw.fakes.bedrock.received == []  # titan-embed-v2 not tried
    record = gw.record(err.value.response.headers["x-switchyard-request-id"])
    assert [a.error_class for a in record.attempts] == [ErrorClass.SERVER_ERROR, ErrorClass.SERVER_ERROR]
    assert record.cost_usd == 0  # answered errors are not billed


async def test_a_timeout_and_a_missing_usage_are_charged_the_bound(gw: EmbeddingGateway) -> None:
    gw.fakes.openai.faults.append(Fault("latency", delay_s=1.0))  # the provider's timeout is 0.5 s
    with pytest.raises(openai.APIStatusError) as err:
        await gw.client().embeddings.create(model="auto", input="slow one")
    bound = input_tokens_bound("cl100k", ["slow one"])
    assert err.value.status_code == 504 and len(gw.fakes.openai.received) == 1  # a billed timeout: no retry
    assert err.value.response.headers["x-switchyard-cost-usd"] == f"{_usd(bound):.8f}"
    gw.fakes.openai.faults.append(Fault("no_usage"))
    done = await gw.client().embeddings.create(model="auto", input="no usage")
    assert done.usage.prompt_tokens == input_tokens_bound("cl100k", ["no usage"]) > fake_tokens("no usage")
    gw.fakes.openai.faults.append(Fault("wrong_count"))
    with pytest.raises(openai.APIStatusError) as err:  # a wrong shape never reaches the client
        await gw.client().embeddings.create(model="auto", input=["a", "b"])
    assert err.value.status_code == 502 and len(gw.fakes.openai.received) == 3  # billed: not retried


async def test_a_client_that_hangs_up_is_charged_and_audited(gw: EmbeddingGateway) -> None:
    gw.fakes.openai.faults.append(Fault("latency", delay_s=0.3))
    body = json.dumps({"model": "auto", "input": "hang up"}).encode()
    task = asyncio.get_running_loop().create_task(gw.pipeline.handle(body, gw.headers()))
    while not gw.fakes.openai.received:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await gw.pipeline.drain()
    gone = gw.audit.exchanges[-1]
    bound = input_tokens_bound("cl100k", ["hang up"])
    assert gone.status_code == 499 and gone.error_code == "client_disconnected" and gone.provider == "openai"
    assert gone.cost_usd == _usd(bound) and not gw.budget.held


async def test_a_withheld_high_risk_embedding_is_recorded_as_the_503_its_caller_got(
    gw: EmbeddingGateway, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses a high-risk record: the vectors are withheld (503) and the record kept
    for the store's return says so; it said 200."""
    tee, spool = gw.audit, AuditSpool(tmp_path / "spool", gw.store, drain_interval_s=3600)
    await spool.start()
    plain = tee.sink
    tee.sink = StoreAuditSink(plain.builder, gw.store, spool)

    def full_disk(items: Any) -> int:
        raise sqlite3.OperationalError("database or disk is full")

    try:
        with monkeypatch.context() as m:
            m.setattr(gw.store, "append", full_disk)
            body = json.dumps({"model": "auto", "input": "ledger line"}).encode()
            answer = await gw.pipeline.handle(body, gw.headers("ledger"))
        await spool.stop()  # the store is back: the spool drains into it
    finally:
        tee.sink = plain
    assert answer.status == 503 and answer.body["error"]["code"] == "audit_unavailable"
    record = gw.record(answer.headers["x-switchyard-request-id"])
    assert (record.status_code, record.error_code, record.cost_usd) == (
        503,
        "audit_unavailable",
        _usd(fake_tokens("ledger line")),
    )


class _BrokenEmbedder:
    name = "openai"

    async def embed(self, call: Any) -> Any:
        raise RuntimeError("a bug in an adapter")


async def test_a_bug_is_the_gateways_500_with_the_request_id_not_a_client_that_left(
    gw: EmbeddingGateway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was recorded as `client_disconnected` (499), and the 500 came without the request's id."""
    real = gw.pipeline.embedders.get
    broken = _BrokenEmbedder()
    monkeypatch.setattr(gw.pipeline.embedders, "get", lambda name: broken if name == "openai" else real(name))
    answer = await gw.pipeline.handle(json.dumps({"model": "auto", "input": "a bug"}).encode(), gw.headers())
    await gw.pipeline.drain()
    record = gw.audit.exchanges[-1]
    assert (answer.status, record.status_code, record.error_code) == (500, 500, "internal_error")
    assert answer.headers["x-request-id"] == answer.headers["x-switchyard-request-id"] == record.ctx.request_id
    assert not gw.budget.held


async def test_the_sdk_reads_an_embeddings_answers_request_id(gw: EmbeddingGateway) -> None:
    """Embeddings answers carried `x-switchyard-request-id` only, so the SDK's `_request_id`
    was None: chat answers carry `x-request-id` too."""
    done = await gw.client().embeddings.create(model="local-embed", input="hello", encoding_format="float")
    assert done._request_id == gw.audit.exchanges[-1].ctx.request_id


# ---------------------------------------------------------------- adapters and registry


async def test_adapters_classify_upstream_errors(gw: EmbeddingGateway) -> None:
    call = EmbeddingCall("m", "text-embedding-3-small", ("a", "b"), 2.0, "r1")
    oai = OpenAIEmbeddingsProvider("openai", f"{gw.fakes.base}/v1", "sk-test-openai-0123456789")
    titan = BedrockEmbeddingsProvider("bedrock", "us-east-1", gw.fakes.base, 2.0)
    titan_call = EmbeddingCall("t", "amazon.titan-embed-text-v2:0", ("a", "b"), 2.0, "r2")
    cases: list[tuple[Any, EmbeddingCall, Fault, ErrorClass, bool]] = [
        (oai, call, Fault("status", status=429, retry_after="3"), ErrorClass.RATE_LIMITED, False),
        (oai, call, Fault("status", status=400, error_type="invalid_request_error"), ErrorClass.BAD_REQUEST, False),
        (oai, call, Fault("malformed"), ErrorClass.SERVER_ERROR, True),
        (titan, titan_call, Fault("status", status=429), ErrorClass.RATE_LIMITED, True),  # the other input billed
        (titan, titan_call, Fault("malformed"), ErrorClass.SERVER_ERROR, True),
    ]
    try:
        for provider, c, fault, error_class, billed in cases:
            up = gw.fakes.openai if provider is oai else gw.fakes.bedrock
            up.reset()
            up.faults.append(fault)
            with pytest.raises(ProviderError) as err:
                await provider.embed(c)
            assert (err.value.error_class, err.value.billed) == (error_class, billed), fault
            while provider is titan and len(up.received) < len(c.inputs):  # Titan calls left in their threads
                await asyncio.sleep(0.01)
        assert err.value.message == "bedrock returned a malformed response"
        with pytest.raises(ProviderError) as err:  # Titan makes 256, 512 or 1024 only: refused before a call
            await titan.embed(EmbeddingCall("t", "amazon.titan-embed-text-v2:0", ("a",), 2.0, "r3", dimensions=300))
        assert err.value.error_class is ErrorClass.BAD_REQUEST and not err.value.billed
        assert oai.name == "openai" and not gw.fakes.openai.rejected and not gw.fakes.bedrock.rejected
    finally:
        await oai.aclose()
        await titan.aclose()


async def test_registry_stands_in_for_what_cannot_embed() -> None:
    missing = Provider(kind=ProviderKind.OPENAI, base_url="http://x", credential=Credential(env="NO_SUCH_KEY_ENV"))
    assert isinstance(build_embedder("openai", missing, None, environ={}), UnreachableEmbedder)
    assert isinstance(build_embedder("anthropic", Provider(kind=ProviderKind.ANTHROPIC), None), UnreachableEmbedder)
    local = Provider(kind=ProviderKind.LOCAL, deployment="local-model")
    assert isinstance(build_embedder("local", local, None), UnreachableEmbedder)  # no cluster
    chat_only = build_embedder("local", local, lambda name, spec: object())  # a client without embed
    assert isinstance(chat_only, UnreachableEmbedder) and "no embed method" in chat_only.reason


async def test_an_unreachable_embedder_fails_as_connection() -> None:
    with pytest.raises(ProviderError) as err:
        await UnreachableEmbedder("openai", "environment variable X is not set").embed(
            EmbeddingCall("m", "v", ("a",), 1.0, "r")
        )
    assert err.value.error_class is ErrorClass.CONNECTION and "X is not set" in err.value.message


# ---------------------------------------------------------------- the local model on CPU


async def test_local_model_embeddings_are_unit_deterministic_and_batch_independent() -> None:
    a, b = LocalChatModel(None), LocalChatModel(None)  # two seeded initialisations
    texts = ["the cat sat", "on the mat", "a" * 128, "ünïcödé"]
    va, vb = a.embed(texts), b.embed(texts)
    assert len(va) == 4 and all(len(v) == a.model.config.d_model == 64 for v in va)
    assert va == vb  # same seed, same vectors
    assert all(abs(sum(x * x for x in v) - 1) < 1e-5 for v in va)
    alone = a.embed(["on the mat"])[0]  # padding in a batch cannot change a text's vector
    assert max(abs(x - y) for x, y in zip(alone, va[1], strict=True)) < 1e-5
    assert va[0] != va[1]
    with pytest.raises(EmbeddingInputError, match="input 1 is 129 tokens"):
        a.embed(["ok", "a" * 129])
    with pytest.raises(EmbeddingInputError, match="input 0 is empty"):
        a.embed([""])
    assert a.embeddings({"input": ["x"], "dimensions": 32})["error"]["code"] == "dimensions_unsupported"


async def test_features_are_what_the_head_reads() -> None:
    """`GPT.features` feeds `forward`: the logits are the head of the features, unchanged."""
    import torch

    model = LocalChatModel(None).model
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        assert torch.equal(model(ids), model.head(model.features(ids)))


async def test_usage_counters_equal_the_audit_records_bills(gw: EmbeddingGateway) -> None:
    """As for chat: each bill is counted and listed in the record (a billed timeout included)."""
    before = len(gw.metrics.usages)
    ids = []
    for fault in (None, Fault("latency", delay_s=1.0), Fault("no_usage")):
        if fault is not None:
            gw.fakes.openai.faults.append(fault)
        try:
            raw = await gw.client().embeddings.with_raw_response.create(model="auto", input=["one", "two"])
            ids.append(raw.headers["x-switchyard-request-id"])
        except openai.APIStatusError as exc:
            ids.append(exc.response.headers["x-switchyard-request-id"])
    await gw.pipeline.drain()
    counted = [(m, p, usd) for _, _, m, p, _, usd in gw.metrics.usages[before:]]
    billed = [(b.model, b.prompt_tokens, b.cost_usd) for rid in ids for b in gw.record(rid).bills]
    assert len(billed) == 3 and sorted(counted) == sorted(billed)
    assert all(abs(sum(b.cost_usd for b in gw.record(r).bills) - gw.record(r).cost_usd) < 1e-12 for r in ids)
