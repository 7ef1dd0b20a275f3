"""The console's figures: traffic buckets, spend by day, the GPU split rebuilt from the
scheduler's event log, and preemption cause chains. Pure; the GPU split is checked against a
generated lease history (print the seed on failure)."""

from __future__ import annotations

import os
import random
from typing import Any

import pytest

from switchyard.console import figures

# The demo's event log (switchyard demo, 2026-12-05), details flattened as the client returns them.
DEMO_EVENTS: list[dict[str, Any]] = [
    {
        "seq": 1,
        "at": 100.0,
        "kind": "replica_pending",
        "workload_id": "serve:gateway/m/a",
        "team": "inference",
        "gpus": 1,
    },
    {
        "seq": 2,
        "at": 100.0,
        "kind": "replica_pending",
        "workload_id": "serve:gateway/m/b",
        "team": "inference",
        "gpus": 1,
    },
    {"seq": 3, "at": 100.0, "kind": "admitted", "workload_id": "serve:gateway/m/a", "team": "inference"},
    {"seq": 4, "at": 100.0, "kind": "admitted", "workload_id": "serve:gateway/m/b", "team": "inference"},
    {"seq": 5, "at": 102.0, "kind": "replica_running", "workload_id": "serve:gateway/m/b", "team": "inference"},
    {"seq": 7, "at": 120.0, "kind": "submitted", "workload_id": "wl-1", "team": "research", "gpus": 6},
    {"seq": 8, "at": 120.1, "kind": "admitted", "workload_id": "wl-1", "team": "research"},
    {
        "seq": 9,
        "at": 190.0,
        "kind": "replica_pending",
        "workload_id": "serve:gateway/m/c",
        "team": "inference",
        "gpus": 1,
    },
    {"seq": 10, "at": 190.0, "kind": "reclaim_decision", "workload_id": "serve:gateway/m/c", "team": "inference"},
    {
        "seq": 11,
        "at": 190.0,
        "kind": "preemption_notice",
        "workload_id": "wl-1",
        "team": "research",
        "preemptor": "serve:gateway/m/c",
        "reason": "reclaim for serve:gateway/m/c",
    },
    {"seq": 12, "at": 195.0, "kind": "requeued", "workload_id": "wl-1", "team": "research"},
    {"seq": 13, "at": 195.1, "kind": "admitted", "workload_id": "serve:gateway/m/c", "team": "inference"},
    {"seq": 14, "at": 200.0, "kind": "replica_running", "workload_id": "serve:gateway/m/c", "team": "inference"},
    {"seq": 15, "at": 245.0, "kind": "released", "workload_id": "serve:gateway/m/c", "team": "inference"},
    {"seq": 16, "at": 245.0, "kind": "admitted", "workload_id": "wl-1", "team": "research"},
    {"seq": 17, "at": 260.0, "kind": "resumed", "workload_id": "wl-1", "team": "research", "step": 25},
]


def test_the_gpu_split_follows_the_demo_through_its_reclaim() -> None:
    assert figures.gpu_split(figures.leased_gpus(DEMO_EVENTS, until=150), 8) == {"serve": 2, "train": 6, "free": 0}
    assert figures.gpu_split(figures.leased_gpus(DEMO_EVENTS, until=196), 8) == {"serve": 3, "train": 0, "free": 5}
    assert figures.gpu_split(figures.leased_gpus(DEMO_EVENTS), 8) == {"serve": 2, "train": 6, "free": 0}
    window = figures.Window(100.0, 300.0, 60.0)
    serve, train, free = figures.gpu_split_series(DEMO_EVENTS, 8, window)
    assert [p[0] for p in serve.points] == [160.0, 220.0, 280.0, 300.0]
    assert [p[1] for p in train.points] == [6, 0, 6, 6] and [p[1] for p in serve.points] == [2, 3, 2, 2]
    assert all(s[1] + t[1] + f[1] == 8 for s, t, f in zip(serve.points, train.points, free.points, strict=True))


def test_a_replica_adopted_without_a_pending_event_counts_its_gpus() -> None:
    """Found in the browser test: a replica adopted with no `replica_pending` before it counted 0."""
    events = [
        {"seq": 1, "at": 1.0, "kind": "adopted", "workload_id": "serve:gateway/m/x", "team": "inference", "gpus": 1},
        {
            "seq": 2,
            "at": 2.0,
            "kind": "replica_pending",
            "workload_id": "serve:gateway/m/y",
            "team": "inference",
            "gpus": 1,
        },
        {"seq": 3, "at": 2.0, "kind": "admitted", "workload_id": "serve:gateway/m/y", "team": "inference"},
    ]
    assert figures.gpu_split(figures.leased_gpus(events), 8) == {"serve": 2, "train": 0, "free": 6}


def test_a_reclaim_is_one_chain_from_decision_to_the_replica_running() -> None:
    [chain] = figures.cause_chains(DEMO_EVENTS)
    assert [(e["kind"], e["workload_id"]) for e in chain] == [
        ("reclaim_decision", "serve:gateway/m/c"),
        ("preemption_notice", "wl-1"),
        ("requeued", "wl-1"),
        ("admitted", "serve:gateway/m/c"),
        ("replica_running", "serve:gateway/m/c"),
    ]
    assert figures.preemptions_by_team(DEMO_EVENTS) == {"research": 1}


def test_a_priority_preemption_without_a_decision_starts_its_own_chain() -> None:
    events = [
        {"seq": 1, "at": 1.0, "kind": "preemption_notice", "workload_id": "low", "team": "a", "preemptor": "high"},
        {"seq": 2, "at": 1.0, "kind": "preemption_notice", "workload_id": "low2", "team": "a", "preemptor": "high"},
        {"seq": 3, "at": 2.0, "kind": "requeued", "workload_id": "low", "team": "a"},
        {"seq": 4, "at": 3.0, "kind": "released", "workload_id": "low2", "team": "a"},
        {"seq": 5, "at": 3.0, "kind": "admitted", "workload_id": "high", "team": "b"},
        {"seq": 6, "at": 9.0, "kind": "admitted", "workload_id": "low", "team": "a"},
    ]
    [chain] = figures.cause_chains(events)
    assert [e["seq"] for e in chain] == [1, 2, 3, 4, 5]


def test_jobs_carry_their_preemptions_and_resumes_and_leave_serve_replicas_out() -> None:
    workloads = [
        {"workload_id": "wl-1", "team": "research", "state": "running"},
        {"workload_id": "serve:gateway/m/a", "team": "inference", "state": "running"},
    ]
    [row] = figures.job_rows(workloads, DEMO_EVENTS)
    assert row["workload_id"] == "wl-1" and row["preemptions"] == 1 and row["resumes"] == 1


def test_traffic_is_counted_per_bucket() -> None:
    from switchyard.console.figures import TRAFFIC_SERIES

    class R:
        def __init__(self, t: float, status: int, error: str | None = None, fallback: bool = False) -> None:
            self.time, self.status_code, self.error_code = t, status, error
            first = type("A", (), {"provider": "local", "model": "gpt"})()
            retry = type("A", (), {"provider": "local", "model": "gpt"})()  # a retry is not a fallback
            other = type("A", (), {"provider": "local-cpu", "model": "gpt"})()
            self.attempts = [first, retry, other] if fallback else [first, retry]

    records: list[Any] = [R(0, 200), R(30, 503, "overloaded"), R(61, 200, fallback=True), R(119, 400), R(500, 200)]
    window = figures.Window(0.0, 120.0, 60.0)
    series = {s.name: [y for _, y in s.points] for s in figures.traffic_series(records, window)}
    assert list(series) == list(TRAFFIC_SERIES)
    assert series == {"requests": [2, 2], "errors": [1, 1], "fallbacks": [0, 1], "sheds": [1, 0]}
    assert figures.traffic_counts(records) == {"requests": 5, "errors": 2, "fallbacks": 1, "sheds": 1}


def test_windows_pick_a_bucket_that_keeps_the_chart_readable() -> None:
    assert figures.Window.covering(0, 3600).bucket_s == 60
    assert figures.Window.covering(0, 86_400).bucket_s == 900
    assert len(figures.Window.covering(10, 7 * 86_400).starts()) <= figures.MAX_BUCKETS


def test_spend_is_summed_per_flow_and_day_with_empty_days_on_the_axis() -> None:
    rows = [
        {"day": "2026-12-01", "flow": "chat", "usd": 0.5},
        {"day": "2026-12-01", "flow": "chat", "usd": 0.25},
        {"day": "2026-12-03", "flow": "assist", "usd": 2.0},
    ]
    days = figures.days_between("2026-12-01", "2026-12-04")
    assert days == ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"]
    by_flow = {s.name: [y for _, y in s.points] for s in figures.spend_by_day(rows, days)}
    assert by_flow == {"assist": [0, 0, 2.0, 0], "chat": [0.75, 0, 0, 0]}
    assert figures.spend_by_flow(rows) == {"assist": 2.0, "chat": 0.75}
    bars = figures.budget_bars([{"budget": "team:x:day", "spent_usd": 0.25, "limit_usd": 1.0}])
    assert [(b.label, b.value, b.limit) for b in bars] == [("team:x:day", 25.0, 100.0)]


SEEDS = int(os.environ.get("SWITCHYARD_CONSOLE_SEEDS", "50"))


@pytest.mark.parametrize("seed", range(SEEDS))
def test_the_gpu_split_matches_a_generated_lease_history(seed: int) -> None:
    """Workloads are submitted, admitted, preempted, resumed and finished at random; at random
    times the split rebuilt from the log equals what the generator knows it held."""
    rng = random.Random(seed)
    events: list[dict[str, Any]] = []
    asked: dict[str, int] = {}
    held: dict[str, int] = {}
    truth: list[tuple[float, dict[str, float]]] = []
    t = 0.0
    for step in range(200):
        t += rng.choice([0.0, 0.5, 3.0])  # equal times happen: the log's order decides
        wid = f"{rng.choice(['serve:app/d/', 'wl-'])}{rng.randrange(12)}"
        if wid not in asked:
            asked[wid] = rng.randint(1, 4)
            kind = "replica_pending" if wid.startswith("serve:") else "submitted"
            events.append({"seq": step, "at": t, "kind": kind, "workload_id": wid, "team": "t", "gpus": asked[wid]})
        elif wid not in held:
            held[wid] = asked[wid]
            kind = rng.choice(["admitted", "adopted"])
            events.append({"seq": step, "at": t, "kind": kind, "workload_id": wid, "team": "t"})
        else:
            del held[wid]
            end = rng.choice(sorted(figures._LEASE_ENDS))
            events.append({"seq": step, "at": t, "kind": end, "workload_id": wid, "team": "t"})
            if end in ("ended", "cancelled", "released") and rng.random() < 0.5:
                del asked[wid]  # gone for good; the id may come back as a new workload
        truth.append((t, figures.gpu_split(held, 64)))
    # At each distinct time, after every event of that time (`until` includes them all).
    final_at = dict(truth)
    for at, split in final_at.items():
        got = figures.gpu_split(figures.leased_gpus(events, until=at), 64)
        assert got == split, f"seed {seed}: at t={at} the log gives {got}, the generator held {split}"
