"""What the gateway counts, as a seam: in-memory counters here, `ray.util.metrics` in the
cluster adapter (`switchyard.cluster.gateway_metrics`), so the Ray dashboard shows them.

Fallbacks and open circuits are counted per provider and reason, so a provider outage is
visible even when every request succeeded through a fallback.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, Protocol


class GatewayMetrics(Protocol):
    def request(self, team: str, flow: str, status: int, provider: str | None) -> None: ...

    def attempt_failed(self, provider: str, error_class: str) -> None: ...

    def fallback(self, from_provider: str, to_provider: str, reason: str) -> None: ...

    def candidate_skipped(self, provider: str, reason: str) -> None: ...

    def circuit_changed(self, provider: str, state: str) -> None: ...

    def stage_latency(self, stage: str, ms: float) -> None: ...

    def shed(self, team: str, flow: str, priority: str, reason: str) -> None:
        """A request refused by admission control (503 `overloaded`)."""
        ...

    def config_refresh(self, source: str, ok: bool) -> None:
        """One refresh of `source` (`policies` or `keys`): False while the replica serves the
        last good set because the current one cannot be loaded (degraded)."""
        ...


class InMemoryMetrics:
    """Counters a replica keeps for its own `status` endpoint (and for tests)."""

    def __init__(self) -> None:
        self.requests: Counter[tuple[str, str, int, str]] = Counter()
        self.attempt_failures: Counter[tuple[str, str]] = Counter()
        self.fallbacks: Counter[tuple[str, str, str]] = Counter()
        self.skips: Counter[tuple[str, str]] = Counter()
        self.circuit_changes: Counter[tuple[str, str]] = Counter()
        self.sheds: Counter[tuple[str, str, str, str]] = Counter()
        self.refresh_failures: Counter[str] = Counter()
        self.degraded: dict[str, bool] = {}

    def request(self, team: str, flow: str, status: int, provider: str | None) -> None:
        self.requests[(team, flow, status, provider or "none")] += 1

    def attempt_failed(self, provider: str, error_class: str) -> None:
        self.attempt_failures[(provider, error_class)] += 1

    def fallback(self, from_provider: str, to_provider: str, reason: str) -> None:
        self.fallbacks[(from_provider, to_provider, reason)] += 1

    def candidate_skipped(self, provider: str, reason: str) -> None:
        self.skips[(provider, reason)] += 1

    def circuit_changed(self, provider: str, state: str) -> None:
        self.circuit_changes[(provider, state)] += 1

    def stage_latency(self, stage: str, ms: float) -> None:
        return None  # latency distributions are the Ray adapter's job (histograms)

    def shed(self, team: str, flow: str, priority: str, reason: str) -> None:
        self.sheds[(team, flow, priority, reason)] += 1

    def config_refresh(self, source: str, ok: bool) -> None:
        self.degraded[source] = not ok
        if not ok:
            self.refresh_failures[source] += 1

    def snapshot(self) -> dict[str, Any]:
        return {
            "attempt_failures": [
                {"provider": p, "error_class": e, "count": n} for (p, e), n in sorted(self.attempt_failures.items())
            ],
            "fallbacks": [
                {"from": f, "to": t, "reason": r, "count": n} for (f, t, r), n in sorted(self.fallbacks.items())
            ],
            "skipped": [{"provider": p, "reason": r, "count": n} for (p, r), n in sorted(self.skips.items())],
            "circuit_changes": [
                {"provider": p, "state": s, "count": n} for (p, s), n in sorted(self.circuit_changes.items())
            ],
            "shed": [
                {"team": t, "flow": f, "priority": p, "reason": r, "count": n}
                for (t, f, p, r), n in sorted(self.sheds.items())
            ],
            "config_refresh_failures": dict(sorted(self.refresh_failures.items())),
        }


class FanOutMetrics:
    """Sends every count to several sinks (the replica's own counters and Ray's)."""

    def __init__(self, *sinks: GatewayMetrics) -> None:
        self.sinks = sinks

    def request(self, team: str, flow: str, status: int, provider: str | None) -> None:
        for s in self.sinks:
            s.request(team, flow, status, provider)

    def attempt_failed(self, provider: str, error_class: str) -> None:
        for s in self.sinks:
            s.attempt_failed(provider, error_class)

    def fallback(self, from_provider: str, to_provider: str, reason: str) -> None:
        for s in self.sinks:
            s.fallback(from_provider, to_provider, reason)

    def candidate_skipped(self, provider: str, reason: str) -> None:
        for s in self.sinks:
            s.candidate_skipped(provider, reason)

    def circuit_changed(self, provider: str, state: str) -> None:
        for s in self.sinks:
            s.circuit_changed(provider, state)

    def stage_latency(self, stage: str, ms: float) -> None:
        for s in self.sinks:
            s.stage_latency(stage, ms)

    def shed(self, team: str, flow: str, priority: str, reason: str) -> None:
        for s in self.sinks:
            s.shed(team, flow, priority, reason)

    def config_refresh(self, source: str, ok: bool) -> None:
        for s in self.sinks:
            s.config_refresh(source, ok)
