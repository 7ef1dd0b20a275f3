"""The figures the console and the offline report draw, computed from the platform's records.

Pure functions over what the stores return (audit records, spend rows, the scheduler's event
log and status, a run's metrics lines): no I/O, no Ray, so every number on a page can be
recomputed in a test from the same records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from switchyard.audit.record import RequestRecord
from switchyard.console.charts import Bar, Series

# Bucket widths a time axis may use: the smallest that keeps a window within MAX_BUCKETS.
_BUCKET_STEPS_S = (60, 300, 900, 3600, 6 * 3600, 86_400)
MAX_BUCKETS = 96


@dataclass(frozen=True)
class Window:
    """[since, until) cut into buckets of `bucket_s`, aligned to multiples of it (UTC)."""

    since: float
    until: float
    bucket_s: float

    @classmethod
    def covering(cls, since: float, until: float) -> Window:
        span = max(until - since, 1.0)
        bucket = next((b for b in _BUCKET_STEPS_S if span / b <= MAX_BUCKETS), _BUCKET_STEPS_S[-1])
        return cls(math.floor(since / bucket) * bucket, until, float(bucket))

    def starts(self) -> list[float]:
        n = max(1, math.ceil((self.until - self.since) / self.bucket_s))
        return [self.since + i * self.bucket_s for i in range(n)]

    def index(self, t: float) -> int | None:
        if t < self.since or t >= self.until:
            return None
        return int((t - self.since) // self.bucket_s)


def first_time(since: float, times: Iterable[float]) -> float:
    """Where a chart's axis starts: `since`, or the first record after it when later (a chart
    of the last week does not draw six empty days before a platform's first request)."""
    return max(since, min(times, default=since))


# ------------------------------------------------------------------------------ gateway traffic

TRAFFIC_SERIES = ("requests", "errors", "fallbacks", "sheds")


def is_error(r: RequestRecord) -> bool:
    return r.status_code >= 400


def is_fallback(r: RequestRecord) -> bool:
    """A fallback was taken: the attempts went to more than one candidate (retries of one
    candidate are not fallbacks, nor is a candidate skipped for an open circuit on its own)."""
    return len({(a.provider, a.model) for a in r.attempts}) > 1


def is_shed(r: RequestRecord) -> bool:
    return r.error_code == "overloaded"  # the gateway's 503 for load it refused (`switchyard_gateway_shed`)


def traffic_counts(records: Iterable[RequestRecord]) -> dict[str, int]:
    counts = dict.fromkeys(TRAFFIC_SERIES, 0)
    for r in records:
        counts["requests"] += 1
        counts["errors"] += is_error(r)
        counts["fallbacks"] += is_fallback(r)
        counts["sheds"] += is_shed(r)
    return counts


def traffic_series(records: Iterable[RequestRecord], window: Window) -> list[Series]:
    """Requests, errors, fallbacks and sheds per bucket (x: the bucket's start)."""
    starts = window.starts()
    per = {name: [0] * len(starts) for name in TRAFFIC_SERIES}
    for r in records:
        i = window.index(r.time)
        if i is None:
            continue
        for name, hit in zip(TRAFFIC_SERIES, (True, is_error(r), is_fallback(r), is_shed(r)), strict=True):
            per[name][i] += hit
    return [Series(name, tuple(zip(starts, map(float, per[name]), strict=True))) for name in TRAFFIC_SERIES]


# ------------------------------------------------------------------------------------- spend


def spend_by_day(rows: Sequence[Mapping[str, Any]], days: Sequence[str] = ()) -> list[Series]:
    """USD per day per flow (x: the day's UTC midnight), from `spend_report`'s `spend` rows;
    every day of `days` is on the axis, with 0 where a flow spent nothing."""
    days = sorted({str(r["day"]) for r in rows} | set(days))
    per_flow: dict[str, dict[str, float]] = {}
    for r in rows:
        flow = per_flow.setdefault(str(r["flow"]), dict.fromkeys(days, 0.0))
        flow[str(r["day"])] += float(r["usd"])
    return [
        Series(flow, tuple((_day_start(d), usd) for d, usd in sorted(by_day.items())))
        for flow, by_day in sorted(per_flow.items())
    ]


def spend_by_flow(rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    out: dict[str, float] = {}
    for r in rows:
        out[str(r["flow"])] = out.get(str(r["flow"]), 0.0) + float(r["usd"])
    return dict(sorted(out.items()))


def budget_bars(budgets: Sequence[Mapping[str, Any]]) -> list[Bar]:
    """One bar per budget line: the share of its limit spent (settled), in percent, so a day's
    line and a month's read on one axis; 100 is the limit."""
    return [
        Bar(str(b["budget"]), 100.0 * float(b["spent_usd"]) / float(b["limit_usd"]) if b["limit_usd"] else 0.0, 100.0)
        for b in budgets
    ]


def days_between(first: str, last: str) -> list[str]:
    """Every UTC day from `first` to `last` (YYYY-MM-DD), both included."""
    start, end = _day_start(first), _day_start(last)
    return [
        datetime.fromtimestamp(start + i * 86_400, UTC).strftime("%Y-%m-%d")
        for i in range(int((end - start) // 86_400) + 1)
    ]


def _day_start(day: str) -> float:
    return datetime.strptime(day, "%Y-%m-%d").replace(tzinfo=UTC).timestamp()


# ------------------------------------------------------------------------------- GPUs over time

_LEASE_STARTS = frozenset({"admitted", "adopted"})
_LEASE_ENDS = frozenset({"released", "requeued", "ended", "node_lost", "cancelled", "claim_timeout"})
GPU_SPLIT_SERIES = ("serve", "train", "free")


def is_serve_workload(workload_id: str) -> bool:
    return workload_id.startswith("serve:")  # the Serve pool's workload ids (`serve_pool`)


def leased_gpus(events: Iterable[Mapping[str, Any]], until: float | None = None) -> dict[str, int]:
    """GPUs each workload holds after the events up to `until`: a lease starts when the
    workload is admitted or adopted, with the GPUs it was submitted (or queued, or adopted, as
    a replica) with, and ends when it is released, requeued, ended, lost or cancelled."""
    asked: dict[str, int] = {}
    held: dict[str, int] = {}
    for e in events:
        if until is not None and float(e["at"]) > until:
            break
        wid, kind = str(e["workload_id"]), str(e["kind"])
        if "gpus" in e and kind in ("submitted", "replica_pending", "adopted"):
            asked[wid] = int(e["gpus"])
        if kind in _LEASE_STARTS:
            held[wid] = asked.get(wid, 0)
        elif kind in _LEASE_ENDS:
            held.pop(wid, None)
    return held


def gpu_split(held: Mapping[str, int], total_gpus: float) -> dict[str, float]:
    serve = float(sum(g for w, g in held.items() if is_serve_workload(w)))
    train = float(sum(g for w, g in held.items() if not is_serve_workload(w)))
    return {"serve": serve, "train": train, "free": max(0.0, total_gpus - serve - train)}


def gpu_split_series(events: Sequence[Mapping[str, Any]], total_gpus: float, window: Window) -> list[Series]:
    """Serve, train and free GPUs at each bucket's end and at `window.until` (the last point is
    the split now). `events` in log order, flattened (`flat_event`)."""
    ordered = sorted(events, key=lambda e: (float(e["at"]), int(e.get("seq", 0))))
    times = [min(s + window.bucket_s, window.until) for s in window.starts()]
    points: dict[str, list[tuple[float, float]]] = {name: [] for name in GPU_SPLIT_SERIES}
    for t in times:
        split = gpu_split(leased_gpus(ordered, t), total_gpus)
        for name in GPU_SPLIT_SERIES:
            points[name].append((t, split[name]))
    return [Series(name, tuple(points[name])) for name in GPU_SPLIT_SERIES]


def flat_event(e: Mapping[str, Any]) -> dict[str, Any]:
    """An event row with its details at the top level, as `SchedulerClient.events()` returns it."""
    details = e.get("details")
    return {**{k: v for k, v in e.items() if k != "details"}, **(details if isinstance(details, Mapping) else {})}


def cause_chains(events: Sequence[Mapping[str, Any]]) -> list[list[dict[str, Any]]]:
    """Each reclaim or preemption with what followed from it, in log order: the decision (a
    reclaim decision, or the first notice of a preemption without one), the notices sent for
    the same preemptor, each victim's release or requeue, and the preemptor's admission (and,
    for a Serve replica, its start)."""
    chains: list[list[dict[str, Any]]] = []
    explained: set[int] = set()  # notices already in a chain
    for i, e in enumerate(events):
        if i in explained or e["kind"] not in ("reclaim_decision", "preemption_notice"):
            continue
        preemptor = str(e["workload_id"] if e["kind"] == "reclaim_decision" else e.get("preemptor", ""))
        chain: list[dict[str, Any]] = [dict(e)]
        victims: set[str] = set()
        started = False
        if e["kind"] == "preemption_notice":
            victims.add(str(e["workload_id"]))
        for j in range(i + 1, len(events)):
            later = events[j]
            kind, wid = later["kind"], str(later["workload_id"])
            if kind == "preemption_notice" and later.get("preemptor") == preemptor:
                victims.add(wid)
                explained.add(j)
            elif not (
                (kind in ("requeued", "released") and wid in victims)
                or (kind in ("admitted", "replica_running") and wid == preemptor)
            ):
                continue
            chain.append(dict(later))
            if kind in ("requeued", "released"):
                victims.discard(wid)
            started = started or kind == "replica_running" or (kind == "admitted" and not is_serve_workload(preemptor))
            if started and not victims:
                break
        chains.append(chain)
    return chains


def preemptions_by_team(events: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    out: dict[str, int] = {}
    for e in events:
        if e["kind"] == "preemption_notice":
            out[str(e["team"])] = out.get(str(e["team"]), 0) + 1
    return dict(sorted(out.items()))


# --------------------------------------------------------------------------------- training


def run_curves(lines: Sequence[Mapping[str, Any]]) -> dict[str, Series]:
    """Loss (and validation loss where logged) and tokens/s by step, from a run's metrics lines."""

    def series(name: str, field: str) -> Series:
        return Series(
            name,
            tuple((float(x["step"]), float(x[field])) for x in lines if isinstance(x.get(field), int | float)),
        )

    return {
        "loss": series("loss", "loss"),
        "val_loss": series("val_loss", "val_loss"),
        "tokens_per_s": series("tokens/s", "tokens_per_s"),
    }


def job_rows(workloads: Sequence[Mapping[str, Any]], events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """A team's training jobs (Serve replicas are the operator's view), with what the log adds:
    how often each was preempted and resumed."""
    preempted: dict[str, int] = {}
    resumed: dict[str, int] = {}
    for e in events:
        wid = str(e["workload_id"])
        if e["kind"] == "preemption_notice":
            preempted[wid] = preempted.get(wid, 0) + 1
        elif e["kind"] == "resumed":
            resumed[wid] = resumed.get(wid, 0) + 1
    return [
        {**w, "preemptions": preempted.get(str(w["workload_id"]), 0), "resumes": resumed.get(str(w["workload_id"]), 0)}
        for w in workloads
        if not is_serve_workload(str(w["workload_id"]))
    ]
