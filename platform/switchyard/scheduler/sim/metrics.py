"""Report metrics from a finished simulation (definitions in docs/scheduler.md)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from switchyard.scheduler.fairness import percentile
from switchyard.scheduler.sim.engine import JobRecord, SimTrace

GANG_BUCKETS = (("1", 1, 1), ("2-4", 2, 7), ("8+", 8, 1 << 30))
QUALITY_METRICS = (
    "utilization",
    "jain_hourly_mean",
    "jain_hourly_p10",
    "share_ratio_min",
    "rho_at_most_1_worst_team",
    "inference_slo_attainment",
    "worst_team_wait_p99_s",
    "priority_inversion_gpu_hours",
    "quota_wait_gpu_hours",
    "preemptions",
    "max_preemptions_per_job",
    "lost_gpu_hours",
)
"""The report's headline numbers, in the order `switchyard sim` and the bench tables show them."""


def wait_stats(records: Sequence[JobRecord]) -> dict[str, float]:
    waits = [r.wait_s for r in records]
    return {
        "jobs": len(records),
        "wait_p50_s": round(percentile(waits, 50), 1),
        "wait_p90_s": round(percentile(waits, 90), 1),
        "wait_p99_s": round(percentile(waits, 99), 1),
    }


def merged_length(intervals: list[tuple[float, float]]) -> float:
    total = 0.0
    end = float("-inf")
    for lo, hi in sorted(intervals):
        if hi <= end:
            continue
        total += hi - max(lo, end)
        end = hi
    return total


@dataclass(frozen=True, slots=True)
class ReportInputs:
    trace: SimTrace
    quotas: dict[str, int]
    slo_bound_s: float
    offered_gpu_s: float


def team_report(records: Sequence[JobRecord], quota: int) -> dict[str, object]:
    out: dict[str, object] = dict(wait_stats(records))
    out["quota_gpus"] = quota
    out["wait_by_gang"] = {
        name: wait_stats([r for r in records if lo <= r.gpus <= hi]) for name, lo, hi in GANG_BUCKETS
    }
    done = [r.finish_s - r.submit_s for r in records if r.finish_s is not None]
    out["jct_mean_s"] = round(sum(done) / len(done), 1) if done else 0.0
    out["jct_p50_s"] = round(percentile(done, 50), 1)
    out["unfinished"] = len(records) - len(done)
    out["unstarted"] = sum(1 for r in records if r.first_start_s is None)
    return out


def most_preempted(records: Sequence[JobRecord]) -> dict[str, object]:
    """The job that received the most preemption notices (first in submit order on a tie)."""
    worst = max(records, key=lambda r: r.preemptions, default=None)
    if worst is None or worst.preemptions == 0:
        return {"max_preemptions_per_job": 0, "most_preempted_job": None}
    return {"max_preemptions_per_job": worst.preemptions, "most_preempted_job": worst.workload_id}


def pending_report(trace: SimTrace) -> dict[str, object]:
    counts = Counter(p.reason for p in trace.pending)
    return {
        "pending_at_end": len(trace.pending),
        "pending_by_reason": dict(sorted(counts.items())),
        "pending": [
            {k: (round(v, 1) if isinstance(v, float) else v) for k, v in asdict(p).items()} for p in trace.pending
        ],
    }


def build_report(inputs: ReportInputs) -> dict[str, object]:
    trace = inputs.trace
    window = trace.window
    span = window.end_s - window.start_s
    by_team: dict[str, list[JobRecord]] = {}
    for record in trace.jobs:
        by_team.setdefault(record.team, []).append(record)
    teams = {t: team_report(rs, inputs.quotas.get(t, 0)) for t, rs in sorted(by_team.items())}
    assert trace.shares is not None and trace.inversions is not None
    ratios = trace.shares.share_ratios()
    for team, row in teams.items():
        row["share_ratio"] = round(ratios[team], 4) if team in ratios else None
        row.update(trace.inversions.team(team))
    violations = []
    for replica in trace.inference:
        started = (
            replica.first_start_s
            if replica.first_start_s is not None
            else (replica.finish_s if replica.finish_s is not None else trace.end_s)
        )
        late_from = replica.submit_s + inputs.slo_bound_s
        lo, hi = max(late_from, window.start_s), min(started, window.end_s)
        if hi > lo:
            violations.append((lo, hi))
    lost = sum(r.lost_gpu_s for r in trace.jobs) + sum(r.lost_gpu_s for r in trace.inference)
    waits_p99 = [t["wait_p99_s"] for t in teams.values() if isinstance(t["wait_p99_s"], float)]
    return {
        "capacity_gpus": trace.capacity,
        "window_days": round(span / 86400, 2),
        "offered_load": round(inputs.offered_gpu_s / (trace.capacity * span), 4),
        "utilization": round(trace.allocated_gpu_s / (trace.capacity * span), 4),
        **trace.shares.report(),
        "inference_slo_attainment": round(1.0 - merged_length(violations) / span, 6),
        "inference_slo_bound_s": inputs.slo_bound_s,
        "preemptions": trace.preemption_notices,
        "lost_gpu_hours": round(lost / 3600, 1),
        **trace.inversions.report(),
        "worst_team_wait_p99_s": max(waits_p99, default=0.0),
        "jobs": len(trace.jobs),
        "events": trace.events,
        **most_preempted([*trace.jobs, *trace.inference]),
        **pending_report(trace),
        "teams": teams,
    }
