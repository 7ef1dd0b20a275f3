"""The gateway's in-memory metrics and their fan-out (`switchyard.gateway.metrics`), without Ray:
token and cost counters, latency and time-to-first-token histograms, and the snapshot the
replica's status endpoint serves."""

from __future__ import annotations

import json

import pytest

from switchyard.gateway.metrics import (
    REQUEST_SECONDS_BUCKETS,
    STAGE_MS_BUCKETS,
    BucketCounts,
    FanOutMetrics,
    GatewayMetrics,
    InMemoryMetrics,
)


def test_usage_sums_tokens_and_cost_per_team_flow_and_model() -> None:
    m = InMemoryMetrics()
    m.usage("search", "answer", "gpt-4o", 100, 20, 0.00045)
    m.usage("search", "answer", "gpt-4o", 50, 10, 0.000225)
    # A fallback that billed two models counts in both.
    m.usage("search", "answer", "claude-sonnet", 80, 0, 0.00024)
    assert m.prompt_tokens[("search", "answer", "gpt-4o")] == 150
    assert m.completion_tokens[("search", "answer", "gpt-4o")] == 30
    assert m.cost_usd[("search", "answer", "gpt-4o")] == pytest.approx(0.000675)
    assert m.snapshot()["usage"] == [
        {
            "team": "search",
            "flow": "answer",
            "model": "claude-sonnet",
            "prompt_tokens": 80,
            "completion_tokens": 0,
            "cost_usd": pytest.approx(0.00024),
        },
        {
            "team": "search",
            "flow": "answer",
            "model": "gpt-4o",
            "prompt_tokens": 150,
            "completion_tokens": 30,
            "cost_usd": pytest.approx(0.000675),
        },
    ]


def test_bucket_counts_are_cumulative_like_prometheus() -> None:
    h = BucketCounts([0.1, 1.0, 10.0])
    for v in (0.05, 0.1, 0.5, 3.0, 200.0):  # 0.1 falls in le=0.1: buckets are upper-inclusive
        h.observe(v)
    assert h.cumulative() == {"0.1": 2, "1": 3, "10": 4, "+Inf": 5}
    assert h.count == 5
    assert h.total == pytest.approx(203.65)


def test_latency_and_first_token_histograms_per_labels() -> None:
    m = InMemoryMetrics()
    m.latency("search", "answer", "openai", 200, 0.4)
    m.latency("search", "answer", "openai", 200, 2.0)
    m.latency("search", "answer", None, 429, 0.002)  # refused before any provider
    m.first_token("search", "answer", "openai", 0.3)
    snap = m.snapshot()
    [refused, ok] = snap["request_seconds"]
    assert (refused["provider"], refused["status"], refused["count"]) == ("none", 429, 1)
    assert refused["buckets"]["0.005"] == 1  # 2 ms: in the first bucket
    assert (ok["provider"], ok["status"], ok["count"], ok["sum"]) == ("openai", 200, 2, pytest.approx(2.4))
    assert ok["buckets"]["0.25"] == 0 and ok["buckets"]["0.5"] == 1 and ok["buckets"]["2.5"] == 2
    assert ok["buckets"]["+Inf"] == 2
    [ttft] = snap["first_token_seconds"]
    assert (ttft["team"], ttft["flow"], ttft["provider"], ttft["count"]) == ("search", "answer", "openai", 1)
    json.dumps(snap)  # the status endpoint serves it as JSON


def test_buckets_span_5_ms_to_120_s_and_stage_ms_reaches_120_s() -> None:
    assert (REQUEST_SECONDS_BUCKETS[0], REQUEST_SECONDS_BUCKETS[-1]) == (0.005, 120.0)
    assert STAGE_MS_BUCKETS[-1] == 120_000
    for bounds in (REQUEST_SECONDS_BUCKETS, STAGE_MS_BUCKETS):
        assert list(bounds) == sorted(set(bounds))


def test_fan_out_sends_every_new_count_to_every_sink() -> None:
    a, b = InMemoryMetrics(), InMemoryMetrics()
    fan: GatewayMetrics = FanOutMetrics(a, b)
    fan.usage("t", "f", "m", 3, 4, 0.5)
    fan.latency("t", "f", "p", 200, 0.01)
    fan.first_token("t", "f", "p", 0.02)
    for sink in (a, b):
        assert (sink.prompt_tokens[("t", "f", "m")], sink.completion_tokens[("t", "f", "m")]) == (3, 4)
        assert sink.cost_usd[("t", "f", "m")] == 0.5
        assert sink.request_seconds[("t", "f", "p", 200)].count == 1
        assert sink.first_token_seconds[("t", "f", "p")].count == 1


def test_an_unused_replica_snapshot_has_empty_new_sections() -> None:
    snap = InMemoryMetrics().snapshot()
    assert (snap["usage"], snap["request_seconds"], snap["first_token_seconds"]) == ([], [], [])
