"""Requests- and tokens-per-minute limits as token buckets, all or nothing across keys.

A bucket holds up to one minute's allowance and refills continuously (`per_minute / 60` per
second), so a team may burst up to its per-minute limit and then runs at the steady rate.
`take` can grant more than needed (`want`) so that a replica can hold a small batch of
permits locally and skip the shared round trip for the next few requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class PermitDemand:
    key: str  # e.g. "team:support:rpm"
    per_minute: int
    need: int  # refuse unless this many are available
    want: int  # grant up to this many


@dataclass(frozen=True)
class PermitsGranted:
    granted: dict[str, int]
    # Whole permits left in each bucket after the take (informational: not part of equality).
    left: dict[str, int] = field(default_factory=dict, compare=False)


@dataclass(frozen=True)
class PermitsRefused:
    key: str
    retry_after_s: float


@dataclass
class _Bucket:
    level: float
    at: float


class TokenBuckets:
    """In-memory buckets. Rate state is deliberately not durable: a restart forgets at most a
    minute of history, which only lets through what the limits allow after a quiet minute."""

    def __init__(self) -> None:
        self._buckets: dict[str, _Bucket] = {}

    def _level(self, key: str, per_minute: int, now: float) -> _Bucket:
        b = self._buckets.get(key)
        if b is None:
            b = self._buckets[key] = _Bucket(float(per_minute), now)
        else:
            # Never less for time gone backwards: a wall-clock step back (NTP) drained a bucket
            # by the step's worth of refill, refusing the key for as long as the step.
            b.level = min(float(per_minute), b.level + max(now - b.at, 0.0) * per_minute / 60.0)
            b.at = now
        return b

    def take(self, demands: tuple[PermitDemand, ...], now: float) -> PermitsGranted | PermitsRefused:
        buckets = [(d, self._level(d.key, d.per_minute, now)) for d in demands]
        for d, b in buckets:
            if d.need > d.per_minute:
                # Can never fit, however long the caller waits; a minute is the honest upper bound
                # on when anything changes (the policy may be raised by then).
                return PermitsRefused(d.key, 60.0)
            if b.level < d.need:
                return PermitsRefused(d.key, (d.need - b.level) * 60.0 / d.per_minute)
        granted, left = {}, {}
        for d, b in buckets:
            n = max(d.need, min(d.want, int(b.level)))
            b.level -= n
            granted[d.key] = n
            left[d.key] = max(int(b.level), 0)
        return PermitsGranted(granted, left)

    def give_back(self, returned: dict[str, int], limits: dict[str, int], now: float) -> None:
        """Return permits a replica held but did not use."""
        for key, n in returned.items():
            b = self._level(key, limits[key], now)
            b.level = min(float(limits[key]), b.level + n)
