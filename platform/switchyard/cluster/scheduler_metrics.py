"""The scheduler's metrics, exported through `ray.util.metrics` (Ray dashboard + Prometheus).

Labelled so a team can see its own wait, as Kueue labels its admission wait time.
"""

from __future__ import annotations

from ray.util.metrics import Counter, Gauge, Histogram

from switchyard.scheduler.driver.views import GaugeReadings

# Up to a week: the waits that matter for big gangs last days, not minutes.
HOUR, DAY = 3600, 86400
WAIT_BUCKETS_S = [1, 5, 15, 30, 60, 120, 300, 600, 1800, HOUR, 4 * HOUR, 12 * HOUR, DAY, 2 * DAY, 4 * DAY, 7 * DAY]
# One scheduling decision (a pass of the core over the queue), seconds.
DECISION_BUCKETS_S = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0]


def gang_bucket(gpus: int) -> str:
    return "1" if gpus <= 1 else "2-4" if gpus <= 4 else "5-7" if gpus < 8 else "8+"


class SchedulerMetrics:
    def __init__(self) -> None:
        self.queue_wait = Histogram(
            "switchyard_scheduler_queue_wait_seconds",
            description="Time from (re)queue to admission, including requeue after preemption.",
            boundaries=WAIT_BUCKETS_S,
            tag_keys=("team", "priority_class", "gang_size"),
        )
        self.gpus = Gauge("switchyard_scheduler_gpus", description="GPUs by pool.", tag_keys=("pool",))
        self.leases = Gauge("switchyard_scheduler_leases", description="Leases by state.", tag_keys=("state",))
        self.queued = Gauge(
            "switchyard_scheduler_queued_workloads", description="Workloads waiting, by team.", tag_keys=("team",)
        )
        self.preemptions = Counter(
            "switchyard_scheduler_preemptions_total",
            description="Preemption notices sent.",
            tag_keys=("team", "reason"),
        )
        self.lost_gpu_seconds = Counter(
            "switchyard_scheduler_lost_gpu_seconds_total",
            description="GPU-seconds of work since the victim's last checkpoint.",
            tag_keys=("team",),
        )
        self.decision_latency = Histogram(
            "switchyard_scheduler_decision_seconds",
            description="Time of one scheduling decision over the whole queue.",
            boundaries=DECISION_BUCKETS_S,
        )
        self.unleased_gpus = Gauge(
            "switchyard_scheduler_unleased_gpus", description="GPUs held by workloads outside any lease."
        )
        self.over_lease_gpus = Gauge(
            "switchyard_scheduler_over_lease_gpus", description="GPUs leased jobs hold beyond their leases."
        )
        self.team_gpus = Gauge(
            "switchyard_scheduler_team_gpus",
            description="A team's GPUs: guaranteed, in use, borrowed (used above its guarantees).",
            tag_keys=("team", "kind"),
        )
        self.fair_share_ratio = Gauge(
            "switchyard_scheduler_fair_share_ratio",
            description="GPU-seconds received / max-min fair GPU-seconds in the last full hour (1: none asked).",
            tag_keys=("team",),
        )
        self.jain_index = Gauge(
            "switchyard_scheduler_jain_index",
            description="Jain's index over the teams' fair-share ratios in the last full hour.",
        )
        self.inversion = Counter(
            "switchyard_scheduler_priority_inversion_gpu_seconds_total",
            description="GPU-seconds queued past the bound within the guarantee while lower priorities held the GPUs.",
            tag_keys=("team",),
        )
        self.quota_wait = Counter(
            "switchyard_scheduler_quota_wait_gpu_seconds_total",
            description="GPU-seconds queued past the bound, needing to borrow, while lower priorities held the GPUs.",
            tag_keys=("team",),
        )
        # What the two counters have been given so far: the readings are totals, a counter
        # takes increments.
        self._counted: dict[tuple[str, str], float] = {}

    def admitted(self, team: str, priority_class: str, gpus: int, waited_s: float) -> None:
        self.queue_wait.observe(
            waited_s, tags={"team": team, "priority_class": priority_class, "gang_size": gang_bucket(gpus)}
        )

    def decided(self, seconds: float) -> None:
        self.decision_latency.observe(seconds)

    def preempted(self, team: str, reason: str, lost_gpu_s: float) -> None:
        self.preemptions.inc(tags={"team": team, "reason": reason})
        if lost_gpu_s > 0:
            self.lost_gpu_seconds.inc(lost_gpu_s, tags={"team": team})

    def show(self, readings: GaugeReadings) -> None:
        """The gauges, every tick."""
        self.gpus.set(readings.free_gpus, tags={"pool": "free"})
        self.gpus.set(readings.leased_gpus, tags={"pool": "leased"})
        for state, count in readings.leases.items():
            self.leases.set(count, tags={"state": state})
        for team, queued in readings.queued.items():
            self.queued.set(queued, tags={"team": team})
        for team, gpus in readings.team_gpus.items():
            self.team_gpus.set(gpus.guaranteed, tags={"team": team, "kind": "guaranteed"})
            self.team_gpus.set(gpus.used, tags={"team": team, "kind": "used"})
            self.team_gpus.set(gpus.borrowed, tags={"team": team, "kind": "borrowed"})
        for team, ratio in readings.share_ratio.items():
            self.fair_share_ratio.set(ratio, tags={"team": team})
        self.jain_index.set(readings.jain)
        self._count_up("inversion", self.inversion, readings.inversion_gpu_s)
        self._count_up("quota_wait", self.quota_wait, readings.quota_wait_gpu_s)

    def _count_up(self, name: str, counter: Counter, totals: dict[str, float]) -> None:
        for team, value in totals.items():
            grown = value - self._counted.get((name, team), 0.0)
            if grown > 0:
                counter.inc(grown, tags={"team": team})
                self._counted[(name, team)] = value
