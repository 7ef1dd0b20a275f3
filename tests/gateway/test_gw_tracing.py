"""The gateway's OpenTelemetry spans (`switchyard.gateway.tracing`), read back from the SDK's
in-memory exporter: their tree, GenAI attributes, error statuses, and that no content and no
exporter thread appear where they must not."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest
from opentelemetry import trace
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from switchyard.gateway.seams import Usage
from switchyard.gateway.tracing import GatewayTracing, RequestSpan, otlp_traces_endpoint

SECRET = "my card is 4111 1111 1111 1111"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


@pytest.fixture
def tracing(exporter: InMemorySpanExporter) -> Iterator[GatewayTracing]:
    t = GatewayTracing(exporter)
    yield t
    t.shutdown()


def by_name(exporter: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {s.name: s for s in exporter.get_finished_spans()}


def start(tracing: GatewayTracing) -> RequestSpan:
    return tracing.start_request("chat", "gpt-4o", team="search", flow="answer", request_id="req-1", max_tokens=256)


def fallback_request(tracing: GatewayTracing) -> None:
    """A request that falls back from OpenAI to Anthropic, with the gateway's stages around."""
    with tracing.request("chat", "gpt-4o", team="search", flow="answer", request_id="req-1", max_tokens=256) as req:
        with tracing.stage("redaction"):
            pass
        with tracing.stage("budget.reserve"):
            pass
        with tracing.attempt(
            req, provider="openai", provider_kind="openai", model="gpt-4o", model_version="gpt-4o-2024-08-06"
        ) as first:
            first.failed("server_error", fallback_reason="server_error")
        with tracing.attempt(
            req,
            provider="anthropic",
            provider_kind="anthropic",
            model="claude-sonnet",
            model_version="claude-sonnet-4-5-20250929",
        ) as second:
            second.answered("claude-sonnet-4-5-20250929", Usage(120, 30), "stop")
        with tracing.stage("budget.settle"), tracing.stage("audit.record"):
            pass
        req.set_response(200)


def test_a_request_with_stages_and_two_attempts_is_one_tree(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    fallback_request(tracing)

    spans = by_name(exporter)
    assert set(spans) == {
        "chat gpt-4o",
        "redaction",
        "budget.reserve",
        "chat gpt-4o-2024-08-06",
        "chat claude-sonnet-4-5-20250929",
        "budget.settle",
        "audit.record",
    }
    root = spans["chat gpt-4o"]
    assert root.parent is None and root.kind is SpanKind.SERVER
    assert root.attributes == {
        "switchyard.team": "search",
        "switchyard.flow": "answer",
        "switchyard.request_id": "req-1",
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "gpt-4o",
        "gen_ai.request.max_tokens": 256,
        "http.response.status_code": 200,
    }
    assert root.status.status_code is StatusCode.UNSET
    trace_id = root.context.trace_id
    for name, span in spans.items():
        assert span.context.trace_id == trace_id
        if name != "chat gpt-4o":
            # Stages and attempts are leaves, never current: one opened inside another's block
            # is still the request's child.
            assert span.parent is not None and span.parent.span_id == root.context.span_id, name

    failed = spans["chat gpt-4o-2024-08-06"]
    assert failed.kind is SpanKind.CLIENT
    assert failed.status.status_code is StatusCode.ERROR and failed.status.description is None
    assert failed.attributes == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.system": "openai",
        "gen_ai.request.model": "gpt-4o-2024-08-06",
        "switchyard.provider": "openai",
        "switchyard.model": "gpt-4o",
        "error.type": "server_error",
        "switchyard.fallback_reason": "server_error",
    }
    answered = spans["chat claude-sonnet-4-5-20250929"]
    assert answered.status.status_code is StatusCode.UNSET
    assert dict(answered.attributes or {}) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "anthropic",
        "gen_ai.system": "anthropic",
        "gen_ai.request.model": "claude-sonnet-4-5-20250929",
        "switchyard.provider": "anthropic",
        "switchyard.model": "claude-sonnet",
        "gen_ai.response.model": "claude-sonnet-4-5-20250929",
        "gen_ai.usage.input_tokens": 120,
        "gen_ai.usage.output_tokens": 30,
        "gen_ai.response.finish_reasons": ("stop",),
    }
    assert spans["budget.reserve"].kind is SpanKind.INTERNAL


def test_bedrock_is_reported_by_its_convention_name(tracing: GatewayTracing, exporter: InMemorySpanExporter) -> None:
    req = start(tracing)
    with tracing.attempt(req, provider="bedrock", provider_kind="bedrock", model="m", model_version="anthropic.x"):
        pass
    req.end()
    assert by_name(exporter)["chat anthropic.x"].attributes["gen_ai.provider.name"] == "aws.bedrock"  # type: ignore[index]


def test_an_embeddings_request_names_its_spans_by_the_operation(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    with (
        tracing.request("embeddings", "embed", team="t", flow="f", request_id="r", max_tokens=None) as req,
        tracing.attempt(req, provider="openai", provider_kind="openai", model="embed", model_version="te-3"),
    ):
        pass
    spans = by_name(exporter)
    assert set(spans) == {"embeddings embed", "embeddings te-3"}
    assert "gen_ai.request.max_tokens" not in (spans["embeddings embed"].attributes or {})
    assert spans["embeddings te-3"].attributes["gen_ai.operation.name"] == "embeddings"  # type: ignore[index]


def test_a_5xx_answer_marks_the_request_failed_and_a_4xx_does_not(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    for request_id, status in [("a", 502), ("b", 429)]:
        req = tracing.start_request("chat", request_id, team="t", flow="f", request_id=request_id, max_tokens=1)
        req.set_response(status, "all_providers_failed" if status >= 500 else None)
        req.end()
    spans = by_name(exporter)
    assert spans["chat a"].status.status_code is StatusCode.ERROR
    assert spans["chat a"].attributes["error.type"] == "all_providers_failed"  # type: ignore[index]
    assert spans["chat b"].status.status_code is StatusCode.UNSET
    assert "error.type" not in (spans["chat b"].attributes or {})


def test_an_exception_marks_spans_failed_with_its_type_and_never_its_message(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    with (
        pytest.raises(ValueError, match="card"),
        tracing.request("chat", "gpt-4o", team="t", flow="f", request_id="r", max_tokens=1) as req,
        tracing.attempt(req, provider="openai", provider_kind="openai", model="gpt-4o", model_version="v"),
    ):
        raise ValueError(SECRET)
    with pytest.raises(asyncio.CancelledError), tracing.stage("audit.record"):
        raise asyncio.CancelledError
    spans = exporter.get_finished_spans()
    assert len(spans) == 3
    types = {s.name: (s.attributes or {}).get("error.type") for s in spans}
    assert types == {
        "chat gpt-4o": "ValueError",
        "chat v": "ValueError",
        "audit.record": "asyncio.exceptions.CancelledError",
    }
    for s in spans:
        assert s.status.status_code is StatusCode.ERROR
        assert not s.events  # no exception event: its message and traceback could quote content
        assert SECRET not in repr(s.to_json())


def test_an_attempt_started_after_the_handler_returned_joins_the_request(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    # A stream's body runs in another task after the handler returned: nothing is current there.
    async def handler() -> RequestSpan:
        return start(tracing)

    async def stream_body(req: RequestSpan) -> None:
        assert trace.get_current_span() is trace.INVALID_SPAN
        with tracing.attempt(req, provider="openai", provider_kind="openai", model="gpt-4o", model_version="v"):
            await asyncio.sleep(0)
        with tracing.stage("budget.settle", req):
            await asyncio.sleep(0)
        req.end()

    async def serve() -> None:
        req = await handler()
        await asyncio.create_task(stream_body(req))

    asyncio.run(serve())
    spans = by_name(exporter)
    root = spans["chat gpt-4o"]
    for name in ("chat v", "budget.settle"):
        assert spans[name].parent is not None and spans[name].parent.span_id == root.context.span_id  # type: ignore[union-attr]


def test_the_request_span_is_current_across_awaits_and_in_tasks_started_inside_it(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    async def reserve() -> None:
        await asyncio.sleep(0)
        with tracing.stage("budget.reserve"):
            await asyncio.sleep(0)

    async def handle() -> None:
        with tracing.request("chat", "gpt-4o", team="t", flow="f", request_id="r", max_tokens=1):
            await asyncio.sleep(0)
            await asyncio.gather(reserve(), asyncio.create_task(reserve()))

    asyncio.run(handle())
    spans = exporter.get_finished_spans()
    root = next(s for s in spans if s.name == "chat gpt-4o")
    stages = [s for s in spans if s.name == "budget.reserve"]
    assert len(stages) == 2
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in stages)


def test_no_content_attribute_is_possible_through_the_api(
    tracing: GatewayTracing, exporter: InMemorySpanExporter
) -> None:
    # Every attribute a span can get is one of these keys: none of the conventions' content
    # attributes (gen_ai.input.messages, gen_ai.output.messages, gen_ai.system_instructions,
    # gen_ai.tool.call.arguments ...).
    allowed = {
        "switchyard.team",
        "switchyard.flow",
        "switchyard.request_id",
        "switchyard.provider",
        "switchyard.model",
        "switchyard.fallback_reason",
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.system",
        "gen_ai.request.model",
        "gen_ai.request.max_tokens",
        "gen_ai.response.model",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.response.finish_reasons",
        "error.type",
        "http.response.status_code",
    }
    fallback_request(tracing)
    seen = {k for s in exporter.get_finished_spans() for k in (s.attributes or {})}
    assert seen <= allowed
    assert not any(k.endswith((".messages", ".arguments", ".result", ".instructions", ".content")) for k in allowed)


def test_unconfigured_tracing_is_a_no_op_that_starts_no_thread() -> None:
    before = set(threading.enumerate())  # threads that end meanwhile are not this test's concern
    tracing = GatewayTracing.from_env({})
    assert not tracing.enabled
    with tracing.request("chat", "m", team="t", flow="f", request_id="r", max_tokens=1) as req:
        with tracing.attempt(req, provider="p", provider_kind="openai", model="m", model_version="v") as attempt:
            attempt.answered("v", Usage(1, 1), "stop")
        with tracing.stage("audit.record"):
            pass
        req.set_response(500)
        assert not req.span.is_recording()
    tracing.shutdown()
    assert not set(threading.enumerate()) - before


def test_a_tracing_with_an_exporter_leaves_the_global_provider_alone(exporter: InMemorySpanExporter) -> None:
    before = trace.get_tracer_provider()
    tracing = GatewayTracing(exporter)
    assert tracing.enabled
    assert trace.get_tracer_provider() is before
    with trace.get_tracer("elsewhere").start_as_current_span("not ours"):
        pass
    tracing.shutdown()
    assert exporter.get_finished_spans() == ()


@pytest.mark.parametrize(
    ("environ", "endpoint"),
    [
        ({}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, "http://collector:4318/v1/traces"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/"}, "http://collector:4318/v1/traces"),
        (
            {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://b/traces"},
            "http://b/traces",
        ),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_SDK_DISABLED": "true"}, None),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://a:4318", "OTEL_TRACES_EXPORTER": "none"}, None),
    ],
)
def test_the_otlp_endpoint_is_read_as_the_spec_says(environ: dict[str, str], endpoint: str | None) -> None:
    assert otlp_traces_endpoint(environ) == endpoint


class Collector(BaseHTTPRequestHandler):
    """A stand-in OTLP/HTTP collector: keeps what is posted to it."""

    received: ClassVar[list[tuple[str, str, bytes]]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.received.append((self.path, self.headers["Content-Type"], body))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return None


def test_a_configured_endpoint_exports_over_otlp_http_from_a_background_thread() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Collector)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    # Counted by name: the collector's request threads (and other tests' executors) come and go.
    def exporters() -> list[threading.Thread]:
        return [t for t in threading.enumerate() if t.name.startswith("OtelBatch") and t.is_alive()]

    before = len(exporters())
    try:
        endpoint = f"http://127.0.0.1:{server.server_port}"
        tracing = GatewayTracing.from_env({"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_SERVICE_NAME": "gw-test"})
        assert tracing.enabled
        assert len(exporters()) == before + 1  # the batch processor's export thread
        req = start(tracing)
        req.end()
        tracing.shutdown()  # flushes
        assert len(exporters()) == before
    finally:
        server.shutdown()
    [(path, content_type, body)] = Collector.received
    assert (path, content_type) == ("/v1/traces", "application/x-protobuf")
    exported = ExportTraceServiceRequest.FromString(body)
    [resource_spans] = exported.resource_spans
    service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}["service.name"]
    names = [span.name for scope in resource_spans.scope_spans for span in scope.spans]
    assert (service, names) == ("gw-test", ["chat gpt-4o"])
