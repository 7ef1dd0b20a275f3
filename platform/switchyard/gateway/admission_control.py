"""Per-replica admission control: bound the requests one gateway replica works on and, when it
is saturated, shed the least urgent first (docs/gateway.md, "Admission control").

(Not `switchyard.budgets.admission`, which decides whether a team may spend.)

A request is counted in two **lanes**: the replica's (every request) and its primary
provider's. A lane has a capacity where policy gives one (`max_in_flight` for the replica,
`provider_max_in_flight` per provider); uncapped provider lanes only observe. A request of
priority class `c` is admitted when, in every capped lane,

    in_flight < shed_at[c] * capacity          (utilisation before admitting it)

and, for non-urgent classes with `team_max_share` set, its team's own in-flight count in the
lane is below `team_max_share * capacity`. Refusing costs a few comparisons and never waits
or queues, so an overloaded replica answers at once instead of stacking work it cannot do.

Retry-After (whole seconds) estimates when the refused class would be admitted again:

    retry_after = clamp(ceil(excess * S / concurrency), 1, max_retry_after_s)

where `S` is the lane's observed service time (an exponentially weighted mean of admission to
release), `concurrency / S` its completion rate by Little's law (`concurrency` is the lane's
in-flight count, or the team's for a team-share refusal), and `excess` how many of those
requests must finish first (`in_flight - limit + 1`; for Serve's backpressure, the depth of
the queue that refused).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from switchyard.policy.models import AdmissionSettings, Priority

DEFAULT_SERVICE_S = 1.0  # assumed until a lane has seen a request finish
EWMA_WEIGHT = 0.2  # weight of the newest service time: follows a shift within ~10 requests

ShedReason = Literal["capacity", "priority", "team_share", "backpressure"]


@dataclass
class _Lane:
    provider: str | None  # None: the replica's own lane
    in_flight: int = 0
    teams: Counter[str] = field(default_factory=Counter)
    service_s: float = DEFAULT_SERVICE_S
    completed: int = 0
    shed: int = 0

    def observe(self, seconds: float) -> None:
        self.service_s = seconds if self.completed == 0 else (1 - EWMA_WEIGHT) * self.service_s + EWMA_WEIGHT * seconds
        self.completed += 1

    def retry_after_s(self, excess: int, concurrency: int, cap_s: int) -> int:
        rate = max(concurrency, 1) / max(self.service_s, 1e-3)  # completions per second
        return min(cap_s, max(1, math.ceil(max(excess, 1) / rate)))


@dataclass(frozen=True)
class Shed:
    """Why a request was refused. Names lanes, classes and counts, never request content."""

    provider: str | None  # the lane that refused: a provider's, or None for the replica's own
    reason: ShedReason
    priority: Priority
    in_flight: int  # the lane's count (the team's, for `team_share`; the queue's, for `backpressure`)
    limit: int  # the count at which this class is refused
    capacity: int
    retry_after_s: int

    def message(self) -> str:
        where = (
            "this gateway replica"
            if self.provider is None
            else f"provider {self.provider!r} (from this gateway replica)"
        )
        retry = f"retry after {self.retry_after_s} s"
        match self.reason:
            case "capacity":
                return f"{where} is at capacity ({self.in_flight} of {self.capacity} requests in flight); {retry}"
            case "priority":
                return (
                    f"{where} is saturated for {self.priority.value} flows ({self.in_flight} of {self.capacity} "
                    f"requests in flight; {self.priority.value} flows are shed from {self.limit}); {retry}"
                )
            case "team_share":
                return (
                    f"the team already has {self.in_flight} requests in flight on {where}, its share of "
                    f"{self.limit} of {self.capacity} for {self.priority.value} flows; {retry}"
                )
            case _:
                return (
                    f"{where}: the model's request queue is full ({self.in_flight} waiting, "
                    f"max_queued_requests {self.capacity}); {retry}"
                )


class Ticket:
    """An admitted request's place in its lanes; `release` (idempotent) frees it."""

    def __init__(self, lanes: tuple[_Lane, ...], team: str, clock: Callable[[], float]) -> None:
        self._lanes = lanes
        self._team = team
        self._clock = clock
        self._started = clock()
        self._released = False

    def release(self) -> None:
        if self._released:
            return
        self._released = True
        took = self._clock() - self._started
        for lane in self._lanes:
            lane.in_flight -= 1
            lane.teams[self._team] -= 1
            if lane.teams[self._team] <= 0:
                del lane.teams[self._team]  # bounded by the teams in flight, not every team ever seen
            lane.observe(took)


class AdmissionController:
    """One per gateway replica. Not thread-safe: it lives on the replica's event loop."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._replica = _Lane(None)
        self._providers: dict[str, _Lane] = {}  # bounded by the provider catalog

    def _provider(self, name: str) -> _Lane:
        lane = self._providers.get(name)
        if lane is None:
            lane = self._providers[name] = _Lane(name)
        return lane

    def admit(self, settings: AdmissionSettings, team: str, priority: Priority, provider: str) -> Ticket | Shed:
        """Admit a request whose primary candidate is `provider`, or say why not."""
        lanes = (self._replica, self._provider(provider))
        capacities = (settings.max_in_flight, settings.provider_max_in_flight.get(provider))
        for lane, capacity in zip(lanes, capacities, strict=True):
            if capacity is None:
                continue
            shed = _refusal(settings, lane, capacity, team, priority)
            if shed is not None:
                lane.shed += 1
                return shed
        for lane in lanes:
            lane.in_flight += 1
            lane.teams[team] += 1
        return Ticket(lanes, team, self._clock)

    def backpressure(
        self, settings: AdmissionSettings, provider: str, priority: Priority, queued: int, max_queued: int
    ) -> Shed:
        """An in-cluster model refused a request because its queue is full (Serve's
        `max_queued_requests`): the same kind of refusal, timed from the provider's lane."""
        lane = self._providers.get(provider) or self._replica
        lane.shed += 1
        retry = lane.retry_after_s(queued, lane.in_flight, settings.max_retry_after_s)
        return Shed(provider, "backpressure", priority, queued, max_queued, max_queued, retry)

    def snapshot(self, settings: AdmissionSettings) -> dict[str, Any]:
        caps = settings.provider_max_in_flight
        return {
            "shed_at": settings.shed_at.model_dump(),
            "team_max_share": settings.team_max_share,
            "replica": _lane_state(self._replica, settings.max_in_flight),
            "providers": {name: _lane_state(lane, caps.get(name)) for name, lane in sorted(self._providers.items())},
        }


def _lane_state(lane: _Lane, capacity: int | None) -> dict[str, Any]:
    return {
        "in_flight": lane.in_flight,
        "capacity": capacity,
        "service_ms": round(lane.service_s * 1000, 1) if lane.completed else None,
        "completed": lane.completed,
        "shed": lane.shed,
    }


def _refusal(settings: AdmissionSettings, lane: _Lane, capacity: int, team: str, priority: Priority) -> Shed | None:
    cap_s = settings.max_retry_after_s
    limit = math.ceil(settings.shed_at.of(priority) * capacity)  # in_flight >= x*cap <=> in_flight >= ceil(x*cap)
    if lane.in_flight >= limit:
        reason: ShedReason = "capacity" if lane.in_flight >= capacity else "priority"
        excess = lane.in_flight - limit + 1
        return Shed(
            lane.provider,
            reason,
            priority,
            lane.in_flight,
            limit,
            capacity,
            lane.retry_after_s(excess, lane.in_flight, cap_s),
        )
    if priority is not Priority.URGENT and settings.team_max_share is not None:
        share = math.ceil(settings.team_max_share * capacity)
        held = lane.teams[team]
        if held >= share:
            return Shed(
                lane.provider,
                "team_share",
                priority,
                held,
                share,
                capacity,
                lane.retry_after_s(held - share + 1, held, cap_s),
            )
    return None
