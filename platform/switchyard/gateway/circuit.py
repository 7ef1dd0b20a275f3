"""Per-provider circuit breakers: a failure-rate window, an open period, half-open probes.

Only failures that say the provider is unwell (timeouts, 429s, 5xx, connection errors)
count; a request the provider rejected, or an answer that missed the output contract, does
not. An opened circuit is reported to the metrics sink: it is an alert, not a silent reroute.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum

from switchyard.policy.models import ErrorClass

PROVIDER_FAULTS = frozenset(
    {ErrorClass.TIMEOUT, ErrorClass.RATE_LIMITED, ErrorClass.SERVER_ERROR, ErrorClass.CONNECTION}
)


class CircuitState(StrEnum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


@dataclass(frozen=True)
class BreakerSettings:
    window_s: float = 30.0  # failure rate is measured over this trailing window
    min_calls: int = 10  # no verdict on fewer calls than this
    failure_rate: float = 0.5  # open at or above this rate
    open_s: float = 15.0  # how long an open circuit rejects calls before probing
    half_open_probes: int = 2  # concurrent trial calls allowed while half-open; all must pass


@dataclass
class CircuitBreaker:
    provider: str
    settings: BreakerSettings
    clock: Callable[[], float] = time.monotonic
    on_change: Callable[[str, CircuitState], None] | None = None
    state: CircuitState = CircuitState.CLOSED
    opened_at: float = 0.0
    times_opened: int = 0
    _outcomes: deque[tuple[float, bool]] = field(default_factory=deque)
    _failures: int = 0  # faults among `_outcomes`
    _probes_in_flight: int = 0
    _probes_passed: int = 0

    def allow(self) -> bool:
        """May a call go to this provider now? A True in half-open state reserves a probe."""
        if self.state is CircuitState.OPEN:
            if self.clock() - self.opened_at < self.settings.open_s:
                return False
            self._move(CircuitState.HALF_OPEN)
        if self.state is CircuitState.HALF_OPEN:
            if self._probes_in_flight + self._probes_passed >= self.settings.half_open_probes:
                return False
            self._probes_in_flight += 1
        return True

    def record(self, error: ErrorClass | None) -> None:
        """The outcome of a call that `allow` let through."""
        fault = error in PROVIDER_FAULTS
        if self.state is CircuitState.HALF_OPEN:
            self._probes_in_flight = max(0, self._probes_in_flight - 1)
            if fault:
                self._open()
            else:
                self._probes_passed += 1
                if self._probes_passed >= self.settings.half_open_probes:
                    self._outcomes.clear()
                    self._failures = 0
                    self._move(CircuitState.CLOSED)
            return
        now = self.clock()
        self._outcomes.append((now, fault))
        self._failures += fault
        self._trim(now)
        calls = len(self._outcomes)
        if calls >= self.settings.min_calls and self._failures / calls >= self.settings.failure_rate:
            self._open()

    def _trim(self, now: float) -> None:
        # A running failure count keeps `record` O(1) amortised on the hot path.
        while self._outcomes and self._outcomes[0][0] < now - self.settings.window_s:
            self._failures -= self._outcomes.popleft()[1]

    def failure_rate(self) -> float:
        self._trim(self.clock())
        return self._failures / len(self._outcomes) if self._outcomes else 0.0

    def _open(self) -> None:
        self.opened_at = self.clock()
        self.times_opened += 1
        self._move(CircuitState.OPEN)

    def _move(self, state: CircuitState) -> None:
        self._probes_in_flight = 0
        self._probes_passed = 0
        self.state = state
        if self.on_change is not None:
            self.on_change(self.provider, state)


class CircuitBoard:
    """The breakers of one gateway replica, created on first use."""

    def __init__(
        self,
        settings: BreakerSettings | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[str, CircuitState], None] | None = None,
    ) -> None:
        self.settings = settings or BreakerSettings()
        self._clock = clock
        self._on_change = on_change
        self._breakers: dict[str, CircuitBreaker] = {}

    def breaker(self, provider: str) -> CircuitBreaker:
        b = self._breakers.get(provider)
        if b is None:
            b = CircuitBreaker(provider, self.settings, self._clock, self._on_change)
            self._breakers[provider] = b
        return b

    def snapshot(self) -> dict[str, dict[str, object]]:
        return {
            name: {"state": b.state.value, "failure_rate": round(b.failure_rate(), 3), "times_opened": b.times_opened}
            for name, b in sorted(self._breakers.items())
        }
