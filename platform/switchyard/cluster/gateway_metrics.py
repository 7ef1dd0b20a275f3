"""The gateway's counters as Ray metrics (`ray.util.metrics`), so the Ray dashboard and its
Prometheus endpoint show fallbacks, open circuits and failures per provider and reason, and
tokens, cost and latency per team and flow.

The per-request counters (requests, tokens, cost) are summed in the process and recorded once
a second (`MetricBatch`): the same totals, a fraction of the CPU per request."""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from switchyard.cluster.metric_batching import MetricBatch
from switchyard.gateway.metrics import REQUEST_SECONDS_BUCKETS, STAGE_MS_BUCKETS

_CIRCUIT_VALUE = {"closed": 0.0, "half_open": 0.5, "open": 1.0}


class RayGatewayMetrics:
    def __init__(self, batch: MetricBatch | None = None) -> None:
        self.batch = batch or MetricBatch()
        self._circuits: dict[str, float] = {}  # each provider breaker's last state, re-set on every refresh tick
        self.requests = Counter(
            "switchyard_gateway_requests",
            "Requests by team, flow, status and answering provider.",
            tag_keys=("team", "flow", "status", "provider"),
        )
        self.failures = Counter(
            "switchyard_gateway_attempt_failures",
            "Failed provider attempts by error class.",
            tag_keys=("provider", "error_class"),
        )
        self.fallbacks = Counter(
            "switchyard_gateway_fallbacks",
            "Fallbacks taken, from which provider to which, and why.",
            tag_keys=("from_provider", "to_provider", "reason"),
        )
        self.skips = Counter(
            "switchyard_gateway_candidates_skipped",
            "Candidates not tried (circuit open, compliance, eval).",
            tag_keys=("provider", "reason"),
        )
        self.circuit_transitions = Counter(
            "switchyard_gateway_circuit_transitions",
            "Circuit state changes per provider.",
            tag_keys=("provider", "state"),
        )
        self.circuit_state = Gauge(
            "switchyard_gateway_circuit_state", "0 closed, 0.5 half-open, 1 open.", tag_keys=("provider",)
        )
        # Ray exports a Counter with a `_total` suffix: Prometheus sees switchyard_gateway_shed_total.
        self.sheds = Counter(
            "switchyard_gateway_shed",
            "Requests refused by admission control (503 overloaded), by team, flow, priority and reason.",
            tag_keys=("team", "flow", "priority", "reason"),
        )
        self.config_degraded = Gauge(
            "switchyard_gateway_config_degraded",
            "1 while the replica serves the last good policies or keys because the current ones fail to load.",
            tag_keys=("source",),
        )
        self.refresh_failures = Counter(
            "switchyard_gateway_config_refresh_failures",
            "Refreshes of policies or keys that failed (the last good set stayed in force).",
            tag_keys=("source",),
        )
        self.stage_ms = Histogram(
            "switchyard_gateway_stage_ms",
            "Gateway stage latency in ms.",
            boundaries=list(STAGE_MS_BUCKETS),
            tag_keys=("stage",),
        )
        # Billed usage per model; the sums equal the audit log's (a fallback that billed two
        # models counts in both).
        self.prompt_tokens = Counter(
            "switchyard_gateway_prompt_tokens",
            "Prompt tokens billed, by team, flow and model.",
            tag_keys=("team", "flow", "model"),
        )
        self.completion_tokens = Counter(
            "switchyard_gateway_completion_tokens",
            "Completion tokens billed, by team, flow and model.",
            tag_keys=("team", "flow", "model"),
        )
        self.cost_usd = Counter(
            "switchyard_gateway_cost_usd",
            "Cost charged in USD, by team, flow and model.",
            tag_keys=("team", "flow", "model"),
        )
        self.request_seconds = Histogram(
            "switchyard_gateway_request_seconds",
            "End-to-end request time in seconds (to the last byte of a stream), by team, flow, provider and status.",
            boundaries=list(REQUEST_SECONDS_BUCKETS),
            tag_keys=("team", "flow", "provider", "status"),
        )
        self.first_token_seconds = Histogram(
            "switchyard_gateway_time_to_first_token_seconds",
            "Time from arrival to the first content byte of a streamed answer, by team, flow and provider.",
            boundaries=list(REQUEST_SECONDS_BUCKETS),
            tag_keys=("team", "flow", "provider"),
        )

    def request(self, team: str, flow: str, status: int, provider: str | None) -> None:
        tags = (("team", team), ("flow", flow), ("status", str(status)), ("provider", provider or "none"))
        self.batch.inc(self.requests, 1.0, tags)
        if provider is not None and provider not in self._circuits:
            self._set_circuit(provider, "closed")  # it answered before its breaker ever changed

    def attempt_failed(self, provider: str, error_class: str) -> None:
        self.failures.inc(1.0, {"provider": provider, "error_class": error_class})

    def fallback(self, from_provider: str, to_provider: str, reason: str) -> None:
        self.fallbacks.inc(1.0, {"from_provider": from_provider, "to_provider": to_provider, "reason": reason})

    def candidate_skipped(self, provider: str, reason: str) -> None:
        self.skips.inc(1.0, {"provider": provider, "reason": reason})

    def circuit_changed(self, provider: str, state: str) -> None:
        self.circuit_transitions.inc(1.0, {"provider": provider, "state": state})
        self._set_circuit(provider, state)

    def _set_circuit(self, provider: str, state: str) -> None:
        self._circuits[provider] = _CIRCUIT_VALUE.get(state, 1.0)
        self.circuit_state.set(self._circuits[provider], {"provider": provider})

    def stage_latency(self, stage: str, ms: float) -> None:
        self.stage_ms.observe(ms, {"stage": stage})

    def shed(self, team: str, flow: str, priority: str, reason: str) -> None:
        self.sheds.inc(1.0, {"team": team, "flow": flow, "priority": priority, "reason": reason})

    def config_refresh(self, source: str, ok: bool) -> None:
        self.config_degraded.set(0.0 if ok else 1.0, {"source": source})
        # Ray drops a gauge nobody sets for a while: the refresh tick keeps every circuit's
        # state set between transitions.
        for provider, value in self._circuits.items():
            self.circuit_state.set(value, {"provider": provider})
        if not ok:
            self.refresh_failures.inc(1.0, {"source": source})

    def usage(self, team: str, flow: str, model: str, prompt_tokens: int, completion_tokens: int, usd: float) -> None:
        tags = (("team", team), ("flow", flow), ("model", model))
        # Ray's Counter.inc refuses 0 (it must be positive): a zero is no change anyway.
        if prompt_tokens > 0:
            self.batch.inc(self.prompt_tokens, float(prompt_tokens), tags)
        if completion_tokens > 0:
            self.batch.inc(self.completion_tokens, float(completion_tokens), tags)
        if usd > 0:
            self.batch.inc(self.cost_usd, usd, tags)

    def latency(self, team: str, flow: str, provider: str | None, status: int, seconds: float) -> None:
        tags = {"team": team, "flow": flow, "provider": provider or "none", "status": str(status)}
        self.request_seconds.observe(seconds, tags)

    def first_token(self, team: str, flow: str, provider: str, seconds: float) -> None:
        self.first_token_seconds.observe(seconds, {"team": team, "flow": flow, "provider": provider})
