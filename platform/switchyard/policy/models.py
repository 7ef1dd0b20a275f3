"""The policy language: pydantic models for every file under `policies/`.

Files are layered org -> team -> flow (see `layering.py`); these models describe one file
each, plus `EffectiveFlow`, the fully merged policy the gateway enforces for one flow.
Unknown fields are errors everywhere: a typo in a policy file must not silently do nothing.
"""

from __future__ import annotations

from datetime import date
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PositiveInt, field_validator, model_validator


class Strict(BaseModel):
    # No inf or NaN (YAML reads `.inf` as a number): a price of `.inf` passed `policy check`,
    # then every request to the model failed converting it to nano-dollars.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class RiskTier(StrEnum):
    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class Role(StrEnum):
    """Who a key speaks for. Ordered from least to most powerful."""

    MEMBER = "member"  # call the gateway as the team
    TEAM_ADMIN = "team-admin"  # + read the team's spend and audit records
    AUDITOR = "auditor"  # read every team's audit records
    PLATFORM_ADMIN = "platform-admin"  # everything


# ---------------------------------------------------------------- budgets and limits


class BudgetLimits(Strict):
    """Hard limits in USD per UTC period; soft thresholds are fractions that raise alerts."""

    day_usd: float | None = Field(default=None, ge=0)
    month_usd: float | None = Field(default=None, ge=0)
    soft_alerts: tuple[float, ...] = (0.8,)

    @field_validator("soft_alerts")
    @classmethod
    def _fractions(cls, v: tuple[float, ...]) -> tuple[float, ...]:
        if any(not 0 < x < 1 for x in v):
            raise ValueError("soft alert thresholds are fractions between 0 and 1 (e.g. 0.8)")
        return tuple(sorted(v))


class RateLimit(Strict):
    requests_per_minute: int | None = Field(default=None, gt=0)
    tokens_per_minute: int | None = Field(default=None, gt=0)


# ---------------------------------------------------------------- providers and models


class ProviderKind(StrEnum):
    OPENAI = "openai"  # OpenAI-compatible HTTP: OpenAI, Azure OpenAI, vLLM, Ray Serve LLM
    ANTHROPIC = "anthropic"  # Anthropic Messages API
    BEDROCK = "bedrock"  # AWS Bedrock Converse via boto3
    SERVE = "serve"  # a Serve deployment in this cluster, through its handle
    LOCAL = "local"  # switchyard's own small model, served in-cluster


class Credential(Strict):
    """Where a secret comes from. The value itself never appears in a policy file."""

    env: str | None = None
    file: str | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Credential:
        if (self.env is None) == (self.file is None):
            raise ValueError("give exactly one of `env` or `file`")
        return self


class Provider(Strict):
    kind: ProviderKind
    base_url: str | None = None
    region: str | None = None
    deployment: str | None = None  # Serve app/deployment name for kind serve/local
    credential: Credential | None = None
    compliance: frozenset[str] = frozenset()  # e.g. {"soc2", "eu-residency", "zdr", "in-cluster"}
    timeout_s: float = Field(default=60.0, gt=0)


MAX_PRICE_PER_MTOK = 1_000_000.0
MAX_CONTEXT_TOKENS = 100_000_000
"""Far above any model's price and context window, and low enough that the largest call's
cost in nano-dollars fits the ledger's 64-bit columns: 10^8 tokens at 10^9 n$/token is 10^17."""

MAX_DEADLINE_MS = 120_000
"""The longest any request may run (a flow's `deadline_ms`, at every layer): the gateway's
budget holds (`LeaseConfig.ttl_s`) and idempotency claims (`claim_timeout_s`) are sized to
outlive it, and each checks that it does when a replica starts."""


class Price(Strict):
    """USD per million tokens, effective from a UTC date until the next entry's date."""

    effective: date
    input_per_mtok: float = Field(ge=0, le=MAX_PRICE_PER_MTOK)
    output_per_mtok: float = Field(ge=0, le=MAX_PRICE_PER_MTOK)
    cached_input_per_mtok: float | None = Field(default=None, ge=0, le=MAX_PRICE_PER_MTOK)


class Capabilities(Strict):
    """What a model can serve. Routing skips a candidate that lacks a feature the request
    uses (with the reason in `x-switchyard-fallback`, metrics and the audit record), rather
    than dropping the feature. Unset means no: a catalog entry declares what it supports."""

    tools: bool = False  # function calling (`tools`, `tool_choice`, tool messages)
    parallel_tool_calls: bool = False  # several tool calls in one answer
    json_schema: bool = False  # native structured output; without it the output contract checks
    vision: bool = False  # image content parts (data URLs)
    image_urls: bool = False  # https image URLs passed to the provider as URLs
    streaming_usage: bool = True  # a stream ends with the provider's token counts
    max_images: int = Field(default=20, ge=0)  # per request
    # The sampling fields the provider takes; a request that sets another skips the model.
    sampling: frozenset[Literal["temperature", "top_p", "stop"]] = frozenset({"temperature", "top_p", "stop"})
    max_temperature: float = Field(default=2.0, ge=0)  # OpenAI's range; Bedrock's Converse stops at 1


class ModelEntry(Strict):
    provider: str
    model_version: str  # the id the provider knows, e.g. "gpt-4o-2024-08-06"
    family: str = "generic"  # tokenizer family for cost estimates
    context_window: int = Field(default=8192, gt=0, le=MAX_CONTEXT_TOKENS)
    task: Literal["chat", "embedding"] = "chat"
    capabilities: Capabilities = Capabilities()
    embedding_dimensions: int | None = Field(default=None, gt=0)  # task embedding: the vector size
    prices: tuple[Price, ...] = ()

    @field_validator("prices")
    @classmethod
    def _sorted_unique_dates(cls, v: tuple[Price, ...]) -> tuple[Price, ...]:
        dates = [p.effective for p in v]
        if len(set(dates)) != len(dates):
            raise ValueError("two prices share an effective date")
        return tuple(sorted(v, key=lambda p: p.effective))

    def price_on(self, day: date) -> Price | None:
        current = None
        for p in self.prices:
            if p.effective <= day:
                current = p
        return current


class ProviderCatalog(Strict):
    providers: dict[str, Provider]
    models: dict[str, ModelEntry]  # key: the model name teams use, e.g. "gpt-4o"

    @model_validator(mode="after")
    def _models_name_known_providers(self) -> ProviderCatalog:
        for name, model in self.models.items():
            if model.provider not in self.providers:
                raise ValueError(
                    f"models.{name}.provider: unknown provider {model.provider!r} "
                    f"(known: {', '.join(sorted(self.providers))})"
                )
        return self


# ---------------------------------------------------------------- data classes


class BodyStorage(StrEnum):
    FULL = "full"
    REDACTED = "redacted"
    HASH = "hash"
    NONE = "none"


class DataClass(Strict):
    """What may leave the platform and what is kept, for one class of data."""

    rank: int  # higher is more sensitive; a team may raise a flow's class, never lower it
    send: Literal["raw", "redacted"] = "raw"
    reversible: bool = False  # restore redaction placeholders in the response
    requires_compliance: frozenset[str] = frozenset()  # provider must carry all of these tags
    store_input: BodyStorage = BodyStorage.FULL
    store_output: BodyStorage = BodyStorage.FULL
    encrypt_bodies: bool = False
    retention_days: int = Field(default=30, gt=0)
    body_readers: frozenset[Role] = frozenset({Role.TEAM_ADMIN, Role.AUDITOR, Role.PLATFORM_ADMIN})
    # Characters of message text one request of this class may carry; for redacted classes it
    # also bounds the redactor's work. The default (~500k tokens) is past every context window.
    max_text_chars: int = Field(default=2_000_000, gt=0)
    # Images in requests of this class. Unset: allowed where `send` is raw, refused where it is
    # redacted, because the redactor reads text only and an image can carry the same data.
    allow_images: bool | None = None

    def images_allowed(self) -> bool:
        return self.allow_images if self.allow_images is not None else self.send == "raw"


class DataPolicies(Strict):
    classes: dict[str, DataClass]

    def rank(self, name: str) -> int:
        return self.classes[name].rank


# ---------------------------------------------------------------- flows


class ErrorClass(StrEnum):
    """Why an attempt failed; fallback rules name these."""

    TIMEOUT = "timeout"
    RATE_LIMITED = "rate_limited"  # 429
    SERVER_ERROR = "server_error"  # 5xx
    CONNECTION = "connection"
    CONTEXT_LENGTH = "context_length"
    CONTENT_FILTER = "content_filter"
    INVALID_OUTPUT = "invalid_output"  # failed the flow's output contract
    BAD_REQUEST = "bad_request"  # caused by the request: never falls back


class FallbackCandidate(Strict):
    model: str
    # Not `on`: YAML 1.1 reads the key `on` as the boolean true.
    on_errors: frozenset[ErrorClass] = frozenset(
        {ErrorClass.TIMEOUT, ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR, ErrorClass.CONNECTION}
    )

    @field_validator("on_errors")
    @classmethod
    def _never_on_bad_request(cls, v: frozenset[ErrorClass]) -> frozenset[ErrorClass]:
        if ErrorClass.BAD_REQUEST in v:
            raise ValueError("a request the provider rejected as malformed never falls back")
        return v


class Priority(StrEnum):
    """How late a flow's requests are shed when the gateway is saturated (urgent last)."""

    URGENT = "urgent"
    STANDARD = "standard"
    BATCH = "batch"


class ImageFetch(Strict):
    """Lets the gateway download https image URLs for providers that take only bytes.

    Off unless a flow sets it. Only the listed hosts, over https, within the size and time
    limits; addresses that resolve to private, loopback or link-local networks are refused
    unless `allow_private_networks` (tests allow 127.0.0.1 explicitly)."""

    allowed_hosts: frozenset[str]
    max_bytes: int = Field(default=5 * 1024 * 1024, gt=0)
    timeout_s: float = Field(default=5.0, gt=0)
    allow_http: bool = False
    allow_private_networks: bool = False


class EvalGate(Strict):
    suite: str  # path under policies/evals/suites/
    threshold: float = Field(ge=0, le=1)


class FlowPolicy(Strict):
    """A flow as written in a team file. Every field is optional: unset ones are inherited."""

    description: str | None = None
    prompt: str | None = None  # "<prompt-id>@<version>"
    allowed_prompt_versions: frozenset[int] | None = None
    input_schema: dict[str, Any] | None = None  # JSON Schema of the prompt variables
    output_schema: dict[str, Any] | None = None  # JSON Schema every answer must satisfy
    allow_free_messages: bool | None = None
    risk_tier: RiskTier | None = None
    priority: Priority | None = None  # admission class; unset: standard
    data_class: str | None = None
    deadline_ms: int | None = Field(default=None, gt=0)
    max_tokens: int | None = Field(default=None, gt=0)
    model: str | None = None  # the primary
    allowed_models: frozenset[str] | None = None
    fallback: tuple[FallbackCandidate, ...] | None = None
    eval: EvalGate | None = None
    allowed_providers: frozenset[str] | None = None
    budget: BudgetLimits | None = None
    rate_limit: RateLimit | None = None
    retention_days: int | None = Field(default=None, gt=0)
    image_fetch: ImageFetch | None = None


class TeamPolicy(Strict):
    """A team file: the team's overrides (`defaults` for its flows) and its flows."""

    team: str
    description: str = ""
    default_flow: str | None = None
    budget: BudgetLimits | None = None
    rate_limit: RateLimit | None = None
    allowed_providers: frozenset[str] | None = None
    retention_days: int | None = Field(default=None, gt=0)
    defaults: FlowPolicy = FlowPolicy()
    flows: dict[str, FlowPolicy] = {}


class Bound(Strict):
    """How far a team may move a field away from the org's value."""

    locked: bool = False  # may not be set below the org at all
    max: float | None = None  # numeric ceiling (budgets, retention)
    min: float | None = None  # numeric floor (e.g. eval.threshold: a team may only demand more)
    min_class: str | None = None  # data class floor, by rank
    subset_of: frozenset[str] | None = None  # sets may only shrink

    @model_validator(mode="after")
    def _floor_below_ceiling(self) -> Bound:
        if self.min is not None and self.max is not None and self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max}): no value could satisfy both")
        return self


class ShedThresholds(Strict):
    """Utilisation (requests in flight / capacity) at which each priority class is shed."""

    batch: float = Field(default=0.5, gt=0, le=1)
    standard: float = Field(default=0.85, gt=0, le=1)
    urgent: float = Field(default=1.0, gt=0, le=1)

    @model_validator(mode="after")
    def _urgent_last(self) -> ShedThresholds:
        if not self.batch <= self.standard <= self.urgent:
            raise ValueError(
                "thresholds must rise with priority, batch <= standard <= urgent, so urgent flows are shed "
                f"last (got batch {self.batch}, standard {self.standard}, urgent {self.urgent})"
            )
        return self

    def of(self, priority: Priority) -> float:
        return float(getattr(self, priority.value))


class AdmissionSettings(Strict):
    """Per-replica load shedding in the gateway (docs/gateway.md, "Admission control")."""

    max_in_flight: int = Field(default=200, gt=0)  # requests one replica works on at once
    provider_max_in_flight: dict[str, PositiveInt] = {}  # per primary provider, per replica
    shed_at: ShedThresholds = ShedThresholds()
    team_max_share: float | None = Field(default=None, gt=0, le=1)  # of a lane, for non-urgent flows
    urgent_teams: frozenset[str] | None = None  # teams whose flows may be urgent; unset: any team
    max_retry_after_s: int = Field(default=30, gt=0)


class RequestLimits(Strict):
    """Checked before any work is done on a request (docs/gateway.md, "Request limits").

    The defaults admit anything that fits a model's context window, base64 images included:
    a 20 MB image is ~27 MB of JSON."""

    max_body_bytes: int = Field(default=32 * 1024 * 1024, gt=0)  # answered 413 past this
    max_messages: int = Field(default=2048, gt=0)
    max_json_depth: int = Field(default=32, gt=0)  # of `variables`, the one free-form field


class GatewaySettings(Strict):
    admission: AdmissionSettings = AdmissionSettings()
    limits: RequestLimits = RequestLimits()


class OrgPolicy(Strict):
    org: str
    budget: BudgetLimits = BudgetLimits()  # the org-wide cap
    rate_limit: RateLimit = RateLimit()
    defaults: FlowPolicy  # every flow starts from these
    guardrails: dict[str, Bound] = {}  # dotted field path -> bound, checked on teams and flows
    gateway: GatewaySettings = GatewaySettings()  # replica-level knobs (admission control)


class EffectiveFlow(Strict):
    """The merged policy of one flow: what the gateway enforces. Every field is resolved."""

    team: str
    flow: str
    description: str = ""
    prompt: str
    allowed_prompt_versions: frozenset[int] = frozenset()
    input_schema: dict[str, Any] = {"type": "object"}
    output_schema: dict[str, Any] | None = None
    allow_free_messages: bool = True
    risk_tier: RiskTier
    priority: Priority = Priority.STANDARD
    data_class: str
    deadline_ms: int
    max_tokens: int
    model: str
    allowed_models: frozenset[str] = frozenset()
    fallback: tuple[FallbackCandidate, ...] = ()
    eval: EvalGate | None = None
    allowed_providers: frozenset[str]
    budget: BudgetLimits = BudgetLimits()
    rate_limit: RateLimit = RateLimit()
    retention_days: int
    image_fetch: ImageFetch | None = None

    @property
    def prompt_id(self) -> str:
        return self.prompt.split("@", 1)[0]

    @property
    def prompt_version(self) -> int:
        return int(self.prompt.split("@", 1)[1])
