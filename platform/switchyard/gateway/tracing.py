"""Traces of gateway requests as OpenTelemetry spans, named and attributed per the GenAI
semantic conventions, so any OTLP backend shows a request, its provider attempts and the
gateway's own stages (budget, audit, redaction) as one trace.

One `GatewayTracing` per gateway, built by whoever builds the gateway and passed in: from the
environment (`from_env`: OTLP/HTTP export when an endpoint is configured, else a no-op tracer
that starts nothing) or around a given exporter (tests). It owns a private TracerProvider and
never sets OpenTelemetry's global one, so two gateways in one process (tests) never share
spans, and a library's instrumentation cannot export through ours by accident.

The tree: a `chat {model}` / `embeddings {model}` request span (SERVER), and under it one
`chat {model_version}` span per provider attempt (CLIENT) and `budget.reserve`,
`budget.settle`, `audit.record` and `redaction` spans (INTERNAL). Attempt and stage spans take
their parent explicitly where it matters: a streamed answer is read after the handler has
returned, outside the request span's `with`, so the pipeline keeps the `RequestSpan` and passes
it. They are never made the current span, so they can open and close in an async generator
without detaching a context token in a different task.

Spans carry identifiers, model names, token counts, finish reasons, statuses and error types,
never request or response content: a trace backend is not a place the data policies let
prompts go. Exceptions are therefore not recorded as span events (their messages may quote
content), only their type as `error.type`, and statuses carry no description.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Final, Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import error_attributes, http_attributes
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from switchyard.gateway.seams import Usage

Operation = Literal["chat", "embeddings"]
Stage = Literal["budget.reserve", "budget.settle", "audit.record", "redaction"]

DEFAULT_SERVICE_NAME: Final = "switchyard-gateway"
INSTRUMENTATION_NAME: Final = "switchyard.gateway"
TEAM: Final = "switchyard.team"
FLOW: Final = "switchyard.flow"
REQUEST_ID: Final = "switchyard.request_id"
PROVIDER: Final = "switchyard.provider"  # the provider's name in providers.yaml
MODEL: Final = "switchyard.model"  # the catalog name; gen_ai.request.model is the provider's id
FALLBACK_REASON: Final = "switchyard.fallback_reason"

# providers.yaml `kind` -> gen_ai.provider.name (the convention's well-known values where one
# exists; switchyard's in-cluster kinds are their own names).
GENAI_PROVIDER_NAMES: Final[Mapping[str, str]] = {
    "openai": gen_ai.GenAiProviderNameValues.OPENAI.value,
    "anthropic": gen_ai.GenAiProviderNameValues.ANTHROPIC.value,
    "bedrock": gen_ai.GenAiProviderNameValues.AWS_BEDROCK.value,
}


def otlp_traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """Where OTLP/HTTP traces go, as the OpenTelemetry spec reads the environment: the traces
    endpoint as given, else the general endpoint plus `/v1/traces`; None when neither is set
    or the SDK is disabled (`OTEL_SDK_DISABLED=true`, `OTEL_TRACES_EXPORTER=none`)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return None
    if traces := environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip():
        return traces
    if base := environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip():
        return base.rstrip("/") + "/v1/traces"
    return None


def error_type(exc: BaseException) -> str:
    """`error.type` for an exception: its fully qualified class name (builtins unqualified)."""
    cls = type(exc)
    return cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"


def _mark_failed(span: Span, error: str) -> None:
    span.set_attribute(error_attributes.ERROR_TYPE, error)
    span.set_status(Status(StatusCode.ERROR))  # no description: it could quote content


@dataclass(frozen=True)
class RequestSpan:
    """The span of one client request; keep it to parent attempts and stages to it later."""

    span: Span
    operation: Operation

    @property
    def context(self) -> Context:
        return trace.set_span_in_context(self.span)

    def set_response(self, status: int, error: str | None = None) -> None:
        """The HTTP status answered; a 5xx marks the span failed (a 4xx is the client's error,
        which the conventions leave unset on a server span), with `error` as its type."""
        self.span.set_attribute(http_attributes.HTTP_RESPONSE_STATUS_CODE, status)
        if status >= 500:
            _mark_failed(self.span, error or str(status))

    def end(self) -> None:
        """For a request span from `start_request`: a stream ends it after its last byte."""
        self.span.end()


@dataclass(frozen=True)
class AttemptSpan:
    """The span of one call to one provider."""

    span: Span

    def answered(self, response_model: str | None, usage: Usage | None, finish_reason: str | None) -> None:
        if response_model:
            self.span.set_attribute(gen_ai.GEN_AI_RESPONSE_MODEL, response_model)
        if usage is not None:
            self.span.set_attribute(gen_ai.GEN_AI_USAGE_INPUT_TOKENS, usage.prompt_tokens)
            self.span.set_attribute(gen_ai.GEN_AI_USAGE_OUTPUT_TOKENS, usage.completion_tokens)
        if finish_reason:
            self.span.set_attribute(gen_ai.GEN_AI_RESPONSE_FINISH_REASONS, [finish_reason])

    def end(self) -> None:
        """For an attempt span from `start_attempt`."""
        self.span.end()

    def failed(self, error: str, fallback_reason: str | None = None) -> None:
        """The attempt failed with `error` (switchyard's error class); `fallback_reason`: why
        the next candidate was tried, when one was."""
        _mark_failed(self.span, error)
        if fallback_reason:
            self.span.set_attribute(FALLBACK_REASON, fallback_reason)


class GatewayTracing:
    """The gateway's tracer. `exporter`: where spans go (None: a no-op tracer, nothing
    started); `batch`: export from a background thread (production) rather than as each span
    ends (tests: `InMemorySpanExporter` sees a span as soon as it ends)."""

    def __init__(
        self, exporter: SpanExporter | None = None, *, batch: bool = False, service_name: str = DEFAULT_SERVICE_NAME
    ) -> None:
        self._provider: TracerProvider | None = None
        self._tracer: Tracer = trace.NoOpTracer()
        if exporter is not None:
            # Flushed at exit only when batching: a simple processor has nothing buffered.
            resource = Resource.create({"service.name": service_name})
            self._provider = TracerProvider(resource=resource, shutdown_on_exit=batch)
            processor = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
            self._provider.add_span_processor(processor)
            self._tracer = self._provider.get_tracer(INSTRUMENTATION_NAME)

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> GatewayTracing:
        """OTLP/HTTP export when `otlp_traces_endpoint(environ)` names an endpoint, else a
        no-op. Headers, TLS, timeout and compression the exporter reads from the standard
        `OTEL_EXPORTER_OTLP_*` variables itself."""
        endpoint = otlp_traces_endpoint(environ)
        if endpoint is None:
            return cls()
        # Imported here: the exporter pulls in protobuf and requests, which a replica without
        # tracing never needs.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        service = environ.get("OTEL_SERVICE_NAME", "").strip() or DEFAULT_SERVICE_NAME
        return cls(OTLPSpanExporter(endpoint=endpoint), batch=True, service_name=service)

    @property
    def enabled(self) -> bool:
        return self._provider is not None

    def shutdown(self) -> None:
        """Export what is buffered and stop the export thread (replica shutdown)."""
        if self._provider is not None:
            self._provider.shutdown()

    def start_request(
        self, operation: Operation, model: str, *, team: str, flow: str, request_id: str, max_tokens: int | None
    ) -> RequestSpan:
        """A request span the caller ends (`RequestSpan.end`): for a stream, whose body runs
        after the handler returned. `model`: the model the client asked for."""
        attributes: dict[str, str | int] = {
            TEAM: team,
            FLOW: flow,
            REQUEST_ID: request_id,
            gen_ai.GEN_AI_OPERATION_NAME: operation,
            gen_ai.GEN_AI_REQUEST_MODEL: model,
        }
        if max_tokens is not None:
            attributes[gen_ai.GEN_AI_REQUEST_MAX_TOKENS] = max_tokens
        span = self._tracer.start_span(f"{operation} {model}", kind=SpanKind.SERVER, attributes=attributes)
        return RequestSpan(span, operation)

    @contextmanager
    def request(
        self, operation: Operation, model: str, *, team: str, flow: str, request_id: str, max_tokens: int | None
    ) -> Iterator[RequestSpan]:
        """A request span, current inside the block (so stages opened there are its children),
        ended at its end; an exception escaping it marks it failed with the exception's type."""
        handle = self.start_request(
            operation, model, team=team, flow=flow, request_id=request_id, max_tokens=max_tokens
        )
        current = trace.use_span(handle.span, end_on_exit=True, record_exception=False, set_status_on_exception=False)
        with current, _failing_on_exception(handle.span):
            yield handle

    @contextmanager
    def attempt(
        self, parent: RequestSpan, *, provider: str, provider_kind: str, model: str, model_version: str
    ) -> Iterator[AttemptSpan]:
        """One provider call under `parent`: `provider` and `provider_kind` as in providers.yaml,
        `model` the catalog name, `model_version` the provider's id for it."""
        handle = self.start_attempt(
            parent, provider=provider, provider_kind=provider_kind, model=model, model_version=model_version
        )
        with _ending(handle.span):
            yield handle

    def start_attempt(
        self, parent: RequestSpan, *, provider: str, provider_kind: str, model: str, model_version: str
    ) -> AttemptSpan:
        """As `attempt`, for a caller that ends the span itself (`AttemptSpan.end`): the attempt
        runner, whose calls end in several places (answer, failure, contract repair)."""
        system = GENAI_PROVIDER_NAMES.get(provider_kind, provider_kind)
        attributes: dict[str, str] = {
            gen_ai.GEN_AI_OPERATION_NAME: parent.operation,
            gen_ai.GEN_AI_PROVIDER_NAME: system,
            gen_ai.GEN_AI_SYSTEM: system,  # the attribute's older name, which many backends still read
            gen_ai.GEN_AI_REQUEST_MODEL: model_version,
            PROVIDER: provider,
            MODEL: model,
        }
        span = self._tracer.start_span(
            f"{parent.operation} {model_version}", parent.context, kind=SpanKind.CLIENT, attributes=attributes
        )
        return AttemptSpan(span)

    def stage(self, name: Stage, parent: RequestSpan | None = None) -> AbstractContextManager[None]:
        """One of the gateway's own stages, under `parent` (default: the current span). It
        takes no attributes: its timing and outcome are what it is for. Untraced, it costs
        nothing: four stages per request are on the hot path."""
        if self._provider is None:
            return nullcontext()
        return self._stage(name, parent)

    @contextmanager
    def _stage(self, name: Stage, parent: RequestSpan | None) -> Iterator[None]:
        span = self._tracer.start_span(name, parent.context if parent is not None else None, kind=SpanKind.INTERNAL)
        with _ending(span):
            yield


@contextmanager
def _failing_on_exception(span: Span) -> Iterator[None]:
    try:
        yield
    except BaseException as exc:  # CancelledError too: a client that went away is an outcome
        _mark_failed(span, error_type(exc))
        raise


@contextmanager
def _ending(span: Span) -> Iterator[None]:
    try:
        with _failing_on_exception(span):
            yield
    finally:
        span.end()
