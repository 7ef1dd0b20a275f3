"""Fairness metrics of a GPU schedule, defined once for the simulator and the live scheduler.

Three questions, each answered per team and over time rather than as one monthly number:

- **Did each team get its fair share while it wanted GPUs?** The fair share is weighted
  max-min over *active demand* (`water_fill`): at every instant each team's demand is the
  GPUs its running and queued work asks for, its weight its guarantee, and capacity is
  filled level by level so that no team can get more without taking from a team that has
  less relative to its weight. `ShareLedger` integrates each team's received and fair
  GPU-seconds per hour; a team's *share ratio* is received / fair over the hours it had a
  fair share, and Jain's index is taken per hour over the teams' uncapped ratios (a team
  above its share is as visible as one below it), then summarised over the hours.
- **Did sharing make a team's jobs finish later than its own cluster would have?** Finish-time
  fairness (Themis, NSDI '20): rho = JCT on the shared cluster / JCT on the team's private
  cluster, per job (`finish_time_fairness`). A job that never finished is counted by its
  censored JCT (until the end of the run), and the report says how many were censored.
- **Did higher-priority work wait while lower-priority work held the GPUs it needed?**
  `InversionLedger` counts GPU-weighted seconds per team: a request queued longer than the
  bound, whose GPUs lower-priority leases hold. A request that fits its team's guarantee
  counts as a priority inversion; one that would borrow counts as a quota wait (its own
  team's quota is what stands in its way), reported separately.

Pure: no Ray, no scheduler internals; callers hand in allocations and demands.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

HOUR_S = 3600.0


def water_fill(capacity: float, demand: Mapping[str, float], weight: Mapping[str, float]) -> dict[str, float]:
    """Weighted max-min fair shares of `capacity` among teams capped by their demand.

    Each team with a positive weight gets min(demand, level x weight) for the one level that
    fills capacity (or satisfies everyone). Teams with no weight (no guarantee) share what the
    weighted teams leave, equally, the same way. Shares never exceed demand and sum to
    min(capacity, total demand)."""
    shares = dict.fromkeys(demand, 0.0)
    left = max(capacity, 0.0)
    weighted = {t: weight.get(t, 0.0) for t, d in demand.items() if d > 0 and weight.get(t, 0.0) > 0}
    unweighted = {t: 1.0 for t, d in demand.items() if d > 0 and weight.get(t, 0.0) <= 0}
    for group in (weighted, unweighted):
        remaining = sum(group.values())
        # In increasing order of the level at which a team's demand is met: a team met below
        # the current level leaves the rest to the others; the level never falls.
        for team in sorted(group, key=lambda t: (demand[t] / group[t], t)):
            give = max(0.0, min(demand[team], left * group[team] / remaining))
            shares[team] = give
            left = max(0.0, left - give)  # never below zero by rounding
            remaining -= group[team]
    return shares


def jain(values: Sequence[float]) -> float:
    """Jain's index: 1 when all values are equal, 1/n when one value holds everything."""
    if not values or not any(values):
        return 1.0
    return sum(values) ** 2 / (len(values) * sum(v * v for v in values))


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return float(ordered[int(rank) - 1])


@dataclass(slots=True)
class _Hour:
    received: dict[str, float] = field(default_factory=dict)  # GPU-seconds
    fair: dict[str, float] = field(default_factory=dict)


class ShareLedger:
    """Received and fair GPU-seconds per team and hour, from piecewise-constant intervals.

    `keep_hours`: how many of the newest hours to keep (the live scheduler keeps a day, so its
    memory is bounded); None keeps all (a simulation reports over its whole window). Hour i
    covers [start_s + i h, start_s + (i + 1) h); intervals must come in time order."""

    def __init__(self, start_s: float, weights: Mapping[str, float], keep_hours: int | None = None) -> None:
        self.start_s = start_s
        self.weights = dict(weights)
        self.keep_hours = keep_hours
        self._hours: dict[int, _Hour] = {}  # hour index -> its sums, oldest first
        self._last: tuple[tuple[tuple[str, int], ...], float, dict[str, float]] | None = None

    def observe(
        self, lo: float, hi: float, capacity: float, allocated: Mapping[str, int], demand: Mapping[str, int]
    ) -> None:
        """GPUs each team held and asked for (held plus queued) over [lo, hi)."""
        if hi <= lo:
            return
        key = tuple(sorted((t, d) for t, d in demand.items() if d > 0))
        if self._last is not None and self._last[0] == key and self._last[1] == capacity:
            fair = self._last[2]  # demand changes far less often than intervals end
        else:
            fair = water_fill(capacity, {t: float(d) for t, d in key}, self.weights)
            self._last = (key, capacity, fair)
        while lo < hi:
            index = self.hour_of(lo)
            edge = min(hi, self.start_s + (index + 1) * HOUR_S)
            hour = self._hours.get(index)
            if hour is None:
                hour = self._hours[index] = _Hour()
                self._forget_old(index)
            span = edge - lo
            for team, gpus in allocated.items():
                if gpus:
                    hour.received[team] = hour.received.get(team, 0.0) + gpus * span
            for team, share in fair.items():
                if share > 0:
                    hour.fair[team] = hour.fair.get(team, 0.0) + share * span
            lo = edge

    def hour_of(self, t: float) -> int:
        return int((t - self.start_s) // HOUR_S)

    def _forget_old(self, newest: int) -> None:
        if self.keep_hours is None:
            return
        for index in [i for i in self._hours if i <= newest - self.keep_hours]:
            del self._hours[index]

    def hourly_jain(self) -> list[float]:
        """Jain's index per hour over the uncapped ratios of the teams that had a fair share
        in it; hours with fewer than two such teams have nothing to compare and are left out."""
        out = []
        for index in self._hours:
            value = self.hour_jain(index)
            if value is not None:
                out.append(value)
        return out

    def hour_jain(self, index: int) -> float | None:
        """Jain's index of hour `index`; None when fewer than two teams had a fair share in it."""
        ratios = list(self.hour_ratios(index).values())
        return jain(ratios) if len(ratios) >= 2 else None

    def hour_ratios(self, index: int) -> dict[str, float]:
        """Per team with a fair share in hour `index`: GPU-seconds received / fair in it."""
        hour = self._hours.get(index)
        if hour is None:
            return {}
        return {t: hour.received.get(t, 0.0) / f for t, f in hour.fair.items() if f > 0}

    def share_ratios(self, hours: range | None = None) -> dict[str, float]:
        """Per team: GPU-seconds received / fair GPU-seconds, over the hours it had a share
        (of the hour indices in `hours`, if given)."""
        received: dict[str, float] = {}
        fair: dict[str, float] = {}
        for index, hour in self._hours.items():
            if hours is not None and index not in hours:
                continue
            for team, f in hour.fair.items():
                fair[team] = fair.get(team, 0.0) + f
                received[team] = received.get(team, 0.0) + hour.received.get(team, 0.0)
        return {t: received[t] / fair[t] for t in sorted(fair) if fair[t] > 0}

    def report(self) -> dict[str, object]:
        hourly = self.hourly_jain()
        return {
            "jain_hourly_mean": round(sum(hourly) / len(hourly), 4) if hourly else 1.0,
            "jain_hourly_p10": round(percentile(hourly, 10), 4) if hourly else 1.0,
            "jain_hours": len(hourly),
            "share_ratio_min": round(min(self.share_ratios().values(), default=1.0), 4),
        }


@dataclass(frozen=True, slots=True)
class JobTimes:
    submit_s: float
    finish_s: float | None  # None: still unfinished when its run ended


@dataclass(frozen=True, slots=True)
class FinishTimeFairness:
    jobs: int
    rho_p50: float
    rho_p90: float
    rho_max: float
    share_rho_at_most_1: float
    censored: int  # jobs unfinished in either run (their JCT counted to that run's end)

    def as_dict(self) -> dict[str, object]:
        return {
            "jobs": self.jobs,
            "rho_p50": round(self.rho_p50, 3),
            "rho_p90": round(self.rho_p90, 3),
            "rho_max": round(self.rho_max, 3),
            "share_rho_at_most_1": round(self.share_rho_at_most_1, 4),
            "censored": self.censored,
        }


def finish_time_fairness(
    shared: Mapping[str, JobTimes], private: Mapping[str, JobTimes], shared_end_s: float, private_end_s: float
) -> FinishTimeFairness:
    """rho per job present in both runs (Themis' finish-time fairness), censored JCTs counted
    to their run's end."""
    rhos: list[float] = []
    censored = 0
    for job, mine in shared.items():
        alone = private.get(job)
        if alone is None:
            continue
        if mine.finish_s is None or alone.finish_s is None:
            censored += 1
        jct_shared = (mine.finish_s if mine.finish_s is not None else shared_end_s) - mine.submit_s
        jct_private = (alone.finish_s if alone.finish_s is not None else private_end_s) - alone.submit_s
        if jct_private > 0:
            rhos.append(max(jct_shared, 0.0) / jct_private)
    if not rhos:
        return FinishTimeFairness(0, 1.0, 1.0, 1.0, 1.0, censored)
    return FinishTimeFairness(
        jobs=len(rhos),
        rho_p50=percentile(rhos, 50),
        rho_p90=percentile(rhos, 90),
        rho_max=max(rhos),
        share_rho_at_most_1=sum(1 for r in rhos if r <= 1.0 + 1e-9) / len(rhos),
        censored=censored,
    )


@dataclass(frozen=True, slots=True)
class Waiting:
    """A queued request past the inversion bound, as the ledger needs it."""

    team: str
    priority: int
    gpus: int


class InversionLedger:
    """GPU-weighted inversion and quota-wait seconds per team (see the module docstring)."""

    def __init__(self, guarantees: Mapping[str, int]) -> None:
        self.guarantees = dict(guarantees)
        self.inversion_gpu_s: dict[str, float] = {}
        self.quota_wait_gpu_s: dict[str, float] = {}

    def observe(
        self,
        span_s: float,
        waiting: Mapping[tuple[int, str], Counter[int]],
        held_below: Mapping[int, int],
        allocated: Mapping[str, int],
    ) -> None:
        """Over `span_s`: `waiting[(priority, team)]` counts the over-bound requests by size,
        `held_below[priority]` is the GPUs strictly lower priorities hold, `allocated` each
        team's GPUs."""
        if span_s <= 0:
            return
        for (priority, team), sizes in waiting.items():
            below = held_below.get(priority, 0)
            if below <= 0:
                continue
            room = self.guarantees.get(team, 0) - allocated.get(team, 0)
            for size, count in sizes.items():
                if count <= 0 or size > below:
                    continue
                target = self.inversion_gpu_s if size <= room else self.quota_wait_gpu_s
                target[team] = target.get(team, 0.0) + size * count * span_s

    def report(self) -> dict[str, object]:
        return {
            "priority_inversion_gpu_hours": round(sum(self.inversion_gpu_s.values()) / HOUR_S, 1),
            "quota_wait_gpu_hours": round(sum(self.quota_wait_gpu_s.values()) / HOUR_S, 1),
        }

    def team(self, team: str) -> dict[str, float]:
        return {
            "inversion_gpu_hours": round(self.inversion_gpu_s.get(team, 0.0) / HOUR_S, 1),
            "quota_wait_gpu_hours": round(self.quota_wait_gpu_s.get(team, 0.0) / HOUR_S, 1),
        }
