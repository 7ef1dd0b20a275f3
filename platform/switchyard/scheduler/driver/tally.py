"""What the gauges and `status` count, kept as events happen instead of from a snapshot.

`LiveTally` holds, per workload, whether it is queued (since when) or holds a lease (how many
GPUs, of which quota entry, running or being preempted), and from that the counts the gauges
export every tick: leases by state, queued workloads per team, and each team's GPUs guaranteed,
used and borrowed. It also feeds the live `FairnessTimeline`, the simulator's own bookkeeping
(`switchyard.scheduler.fairness_timeline`), so the live share ratios, Jain's index and priority
inversion are the simulator's definitions computed on the live sequence of events.

It follows the driver's state: after each event the driver names the workloads whose queue or
lease changed (every such change is journaled, so the event's `JournalEvent`s name them) and
the tally reads where each stands now from `LiveState` and the core. A change made outside the
driver (the Serve pool adopting a replica) is caught up with `rebuild`.

Derived state: not in the write-ahead log or the snapshots. A restarted scheduler rebuilds the
counts from its restored state; its fairness hours and inversion totals start again from then.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from switchyard.scheduler.core import LeaseState, SchedulerPolicy
from switchyard.scheduler.driver.state import LiveState
from switchyard.scheduler.fairness import HOUR_S
from switchyard.scheduler.fairness_timeline import FairnessTimeline

INVERSION_BOUND_S = 300.0
"""How long a request may queue before lower-priority GPUs in its way count as an inversion:
the simulator's default bound (`switchyard sim --slo-bound-s`)."""
KEEP_HOURS = 25
"""The hour being filled and the last day of full hours."""


@dataclass(frozen=True, slots=True)
class _Queued:
    team: str
    gpus: int
    since: float


@dataclass(frozen=True, slots=True)
class _Held:
    lease_id: str
    team: str
    priority: int
    gpus: int
    entry: int  # the team's quota entry the lease is charged to
    preempting: bool


@dataclass(frozen=True, slots=True)
class TeamGpus:
    guaranteed: int
    used: int
    borrowed: int
    """GPUs used above the guarantee, summed over the team's quota entries (as the core counts)."""


class LiveTally:
    def __init__(self, policy: SchedulerPolicy, inversion_bound_s: float = INVERSION_BOUND_S) -> None:
        self._policy = policy
        self._teams = {t.name: t for t in policy.teams}
        self._guarantees = {t.name: t.guaranteed_gpus for t in policy.teams}
        self._bound_s = inversion_bound_s
        self._queued: dict[str, _Queued] = {}
        self._held: dict[str, _Held] = {}
        self._queued_count = dict.fromkeys(self._teams, 0)
        self._entry_usage: dict[tuple[str, int], int] = {}
        self._leases = {s.value: 0 for s in LeaseState}
        self.timeline = FairnessTimeline(self._guarantees, 0, inversion_bound_s, 0.0, KEEP_HOURS)
        self._at: float | None = None  # the timeline is integrated up to here
        self.started_at: float | None = None  # the first event it saw (its totals count from here)

    @classmethod
    def of(cls, state: LiveState) -> LiveTally:
        tally = cls(state.core.policy)
        tally.follow(state, list(state.queued_since) + list(state.grants))
        return tally

    # ------------------------------------------------------------------ following the state
    def advance(self, now: float) -> None:
        """Integrate the fairness timeline up to `now` (nothing changed since the last event)."""
        if self._at is None:
            self._at = self.started_at = now
        elif now > self._at:
            self.timeline.observe(self._at, now)
            self._at = now

    def follow(self, state: LiveState, workload_ids: Iterable[str]) -> None:
        """Read where each of `workload_ids` stands now: queued, holding a lease, or neither."""
        self.timeline.capacity = state.core.pool.total_gpus
        for wid in dict.fromkeys(workload_ids):
            self._follow_queue(state, wid)
            self._follow_lease(state, wid)

    def rebuild(self, state: LiveState, now: float) -> None:
        """The state changed outside the driver's events: follow every workload there is."""
        self.advance(now)
        every = [*self._queued, *self._held, *state.queued_since, *state.grants]
        self.follow(state, every)

    def _follow_queue(self, state: LiveState, wid: str) -> None:
        since = state.queued_since.get(wid)
        sub = state.submissions.get(wid)
        queued = None if since is None or sub is None else _Queued(sub.team, sum(sub.bundles), since)
        was = self._queued.get(wid)
        if was == queued:
            return
        if was is not None:
            del self._queued[wid]
            self._queued_count[was.team] -= 1
            self.timeline.dequeue(wid, was.team, was.gpus)
        if queued is not None and sub is not None:
            self._queued[wid] = queued
            self._queued_count[queued.team] = self._queued_count.get(queued.team, 0) + 1
            self.timeline.queue(wid, queued.team, self._priority(sub.priority_class), queued.gpus, queued.since)

    def _follow_lease(self, state: LiveState, wid: str) -> None:
        lease = state.core.lease_of(wid)
        held = None
        if lease is not None:
            request = lease.request
            held = _Held(
                lease.lease_id,
                request.team,
                self._priority(request.priority_class),
                lease.gpus,
                self._teams[request.team].quota_index(request.workload_class, lease.gpu_type),
                lease.state is LeaseState.PREEMPTING,
            )
        was = self._held.get(wid)
        if was == held:
            return
        if was is not None:
            del self._held[wid]
            self._count_lease(was, -1)
        if held is not None:
            self._held[wid] = held
            self._count_lease(held, +1)

    def _count_lease(self, held: _Held, sign: int) -> None:
        state = LeaseState.PREEMPTING if held.preempting else LeaseState.RUNNING
        self._leases[state.value] += sign
        key = (held.team, held.entry)
        self._entry_usage[key] = self._entry_usage.get(key, 0) + sign * held.gpus
        self.timeline.hold(held.team, held.priority, sign * held.gpus)

    def _priority(self, priority_class: str) -> int:
        return self._policy.priority(priority_class).value

    # ------------------------------------------------------------------ readings
    def leases(self) -> dict[str, int]:
        """Lease state -> leases in it, every state present."""
        return dict(self._leases)

    def queued(self) -> dict[str, int]:
        """Team -> workloads queued, every team of the policy present."""
        return dict(self._queued_count)

    def team_gpus(self) -> dict[str, TeamGpus]:
        out = {}
        for name, team in self._teams.items():
            usage = [self._entry_usage.get((name, i), 0) for i in range(len(team.quotas))]
            borrowed = sum(max(0, u - q.guaranteed_gpus) for u, q in zip(usage, team.quotas, strict=True))
            out[name] = TeamGpus(team.guaranteed_gpus, sum(usage), borrowed)
        return out

    def fairness(self, now: float) -> dict[str, Any]:
        """Per team: received / fair GPU-seconds in the last full hour and over the last day,
        and inversion and quota-wait GPU-seconds over the last day (`_1d`: this hour and the 23
        before it) and since the tally started; Jain's index of the last full hour (None when
        fewer than two teams had a fair share in it)."""
        shares = self.timeline.shares
        last = shares.hour_of(now) - 1
        hour = shares.hour_ratios(last)
        day = shares.share_ratios(range(last - 23, last + 1))
        inversions = self.timeline.inversions
        recent = self.timeline.recent_inversions(now, 24)
        teams = {
            name: {
                "share_ratio_1h": hour.get(name),
                "share_ratio_1d": day.get(name),
                "inversion_gpu_s": inversions.inversion_gpu_s.get(name, 0.0),
                "quota_wait_gpu_s": inversions.quota_wait_gpu_s.get(name, 0.0),
                "inversion_gpu_s_1d": recent.inversion_gpu_s.get(name, 0.0),
                "quota_wait_gpu_s_1d": recent.quota_wait_gpu_s.get(name, 0.0),
            }
            for name in self._teams
        }
        return {
            "hour_start": shares.start_s + last * HOUR_S,
            "jain_1h": shares.hour_jain(last),
            "since": self.started_at,
            "inversion_bound_s": self._bound_s,
            "teams": teams,
        }
