"""What the gateway counts, as a seam: in-memory counters here, `ray.util.metrics` in the
cluster adapter (`switchyard.cluster.gateway_metrics`), so the Ray dashboard shows them.

Fallbacks and open circuits are counted per provider and reason, so a provider outage is
visible even when every request succeeded through a fallback. Tokens and cost are counted
per team, flow and billed model, so their sums can be held against the audit log; latency
and time to first token are histograms, with the bucket bounds defined here once for both
sinks.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any, Protocol

# Seconds, 5 ms to 120 s: a cached answer to the longest streamed answer a deadline allows.
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0,
)  # fmt: skip
# Milliseconds, 0.1 ms (a policy lookup) to 120 s (a provider attempt at its deadline).
STAGE_MS_BUCKETS: tuple[float, ...] = (
    0.1, 0.25, 0.5, 1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10_000, 30_000, 60_000, 120_000,
)  # fmt: skip


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

    def usage(self, team: str, flow: str, model: str, prompt_tokens: int, completion_tokens: int, usd: float) -> None:
        """What one request was charged for one model (per billed model: a fallback that billed
        two models counts twice). The sums equal the audit log's usage and cost."""
        ...

    def latency(self, team: str, flow: str, provider: str | None, status: int, seconds: float) -> None:
        """End-to-end time of one request, streaming or not, every status (to its last byte)."""
        ...

    def first_token(self, team: str, flow: str, provider: str, seconds: float) -> None:
        """Time from arrival to the first content byte of a streamed answer."""
        ...


class BucketCounts:
    """One histogram as Prometheus keeps it: observations per upper bound, their sum and count."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1  # bucket `le` bound: value <= bound
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> dict[str, int]:
        """Observations at or below each bound, keyed as Prometheus's `le` label."""
        out: dict[str, int] = {}
        running = 0
        for label, n in zip([f"{b:g}" for b in self.bounds] + ["+Inf"], self.counts, strict=True):
            running += n
            out[label] = running
        return out


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
        # (team, flow, model)
        self.prompt_tokens: Counter[tuple[str, str, str]] = Counter()
        self.completion_tokens: Counter[tuple[str, str, str]] = Counter()
        self.cost_usd: defaultdict[tuple[str, str, str], float] = defaultdict(float)
        # (team, flow, provider, status) and (team, flow, provider)
        self.request_seconds: dict[tuple[str, str, str, int], BucketCounts] = {}
        self.first_token_seconds: dict[tuple[str, str, str], BucketCounts] = {}

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

    def usage(self, team: str, flow: str, model: str, prompt_tokens: int, completion_tokens: int, usd: float) -> None:
        key = (team, flow, model)
        self.prompt_tokens[key] += prompt_tokens
        self.completion_tokens[key] += completion_tokens
        self.cost_usd[key] += usd

    def latency(self, team: str, flow: str, provider: str | None, status: int, seconds: float) -> None:
        key = (team, flow, provider or "none", status)
        self.request_seconds.setdefault(key, BucketCounts(REQUEST_SECONDS_BUCKETS)).observe(seconds)

    def first_token(self, team: str, flow: str, provider: str, seconds: float) -> None:
        key = (team, flow, provider)
        self.first_token_seconds.setdefault(key, BucketCounts(REQUEST_SECONDS_BUCKETS)).observe(seconds)

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
            "usage": [
                {
                    "team": t,
                    "flow": f,
                    "model": m,
                    "prompt_tokens": self.prompt_tokens[(t, f, m)],
                    "completion_tokens": self.completion_tokens[(t, f, m)],
                    "cost_usd": self.cost_usd[(t, f, m)],
                }
                for (t, f, m) in sorted(
                    self.prompt_tokens.keys() | self.completion_tokens.keys() | self.cost_usd.keys()
                )
            ],
            "request_seconds": [
                {"team": t, "flow": f, "provider": p, "status": s, **_histogram(h)}
                for (t, f, p, s), h in sorted(self.request_seconds.items())
            ],
            "first_token_seconds": [
                {"team": t, "flow": f, "provider": p, **_histogram(h)}
                for (t, f, p), h in sorted(self.first_token_seconds.items())
            ],
        }


def _histogram(h: BucketCounts) -> dict[str, Any]:
    return {"count": h.count, "sum": h.total, "buckets": h.cumulative()}


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

    def usage(self, team: str, flow: str, model: str, prompt_tokens: int, completion_tokens: int, usd: float) -> None:
        for s in self.sinks:
            s.usage(team, flow, model, prompt_tokens, completion_tokens, usd)

    def latency(self, team: str, flow: str, provider: str | None, status: int, seconds: float) -> None:
        for s in self.sinks:
            s.latency(team, flow, provider, status, seconds)

    def first_token(self, team: str, flow: str, provider: str, seconds: float) -> None:
        for s in self.sinks:
            s.first_token(team, flow, provider, seconds)
