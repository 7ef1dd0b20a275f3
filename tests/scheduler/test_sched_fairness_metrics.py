"""The fairness metrics (`switchyard.scheduler.fairness`): water-filling against a brute-force
definition on generated demands, the hourly Jain and share ratios on schedules whose answer
is known, Themis' rho with censored jobs, and inversion split from quota waits."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from switchyard.scheduler.fairness import (
    InversionLedger,
    JobTimes,
    ShareLedger,
    finish_time_fairness,
    jain,
    water_fill,
)


def _max_min_by_bisection(capacity: float, demand: dict[str, float], weight: dict[str, float]) -> dict[str, float]:
    """The definition, computed another way: the level at which min(d, level * w) sums to
    the capacity, by bisection (weighted teams first, then the unweighted share the rest)."""
    out = dict.fromkeys(demand, 0.0)
    left = capacity
    for group in (
        {t: w for t in demand if (w := weight.get(t, 0.0)) > 0 and demand[t] > 0},
        {t: 1.0 for t in demand if weight.get(t, 0.0) <= 0 and demand[t] > 0},
    ):
        if not group:
            continue
        if sum(demand[t] for t in group) <= left:
            for t in group:
                out[t] = demand[t]
            left -= sum(demand[t] for t in group)
            continue
        lo, hi = 0.0, max(demand[t] / w for t, w in group.items())
        for _ in range(200):
            mid = (lo + hi) / 2
            if sum(min(demand[t], mid * w) for t, w in group.items()) > left:
                hi = mid
            else:
                lo = mid
        for t, w in group.items():
            out[t] = min(demand[t], lo * w)
        left = 0.0
    return out


@pytest.mark.parametrize("seed", range(300))
def test_water_fill_is_weighted_max_min(seed: int) -> None:
    rng = random.Random(seed)
    teams = [f"t{i}" for i in range(rng.randint(1, 9))]
    demand = {t: float(rng.choice([0, rng.randint(1, 64)])) for t in teams}
    weight = {t: float(rng.choice([0, rng.randint(1, 40)])) for t in teams}
    capacity = float(rng.randint(0, 200))
    shares = water_fill(capacity, demand, weight)
    expected = _max_min_by_bisection(capacity, demand, weight)
    for t in teams:
        assert shares[t] == pytest.approx(expected[t], abs=1e-6), f"seed {seed}: {t}"
        assert 0.0 <= shares[t] <= demand[t] + 1e-9, f"seed {seed}"
    assert sum(shares.values()) == pytest.approx(min(capacity, sum(demand.values())), abs=1e-6), f"seed {seed}"


def test_water_fill_examples() -> None:
    # Equal weights: the small demand is met, the rest split evenly.
    assert water_fill(10, {"a": 2, "b": 10, "c": 10}, {"a": 1, "b": 1, "c": 1}) == {"a": 2, "b": 4, "c": 4}
    # Weights 3:1 when both want everything.
    assert water_fill(8, {"a": 8, "b": 8}, {"a": 3, "b": 1}) == {"a": 6, "b": 2}
    # A team without a guarantee gets only what the guaranteed teams leave.
    assert water_fill(8, {"a": 5, "z": 8}, {"a": 1}) == {"a": 5, "z": 3}


def test_jain_bounds() -> None:
    assert jain([1, 1, 1, 1]) == 1.0
    assert jain([1, 0, 0, 0]) == pytest.approx(0.25)
    assert jain([]) == 1.0


def test_a_team_above_its_share_lowers_the_hourly_jain() -> None:
    """Two teams each want 8 of 8 GPUs with equal guarantees: a schedule giving one team all
    of them for an hour scores 0.5 (the old capped input would have hidden team a's excess)."""
    fair = ShareLedger(0.0, {"a": 4, "b": 4})
    fair.observe(0, 3600, 8, {"a": 4, "b": 4}, {"a": 8, "b": 8})
    unfair = ShareLedger(0.0, {"a": 4, "b": 4})
    unfair.observe(0, 3600, 8, {"a": 8, "b": 0}, {"a": 8, "b": 8})
    assert fair.hourly_jain() == [1.0]
    assert unfair.hourly_jain() == [pytest.approx(0.5)]
    assert unfair.share_ratios() == {"a": pytest.approx(2.0), "b": 0.0}


def test_fair_shares_follow_demand_hour_by_hour() -> None:
    """Team b is idle in hour 0 (a may use everything) and busy in hour 1 (a keeps all the
    GPUs): a's hour 0 is fair, hour 1 is not. A monthly total would average the two."""
    ledger = ShareLedger(0.0, {"a": 4, "b": 4})
    ledger.observe(0, 3600, 8, {"a": 8}, {"a": 8})
    ledger.observe(3600, 7200, 8, {"a": 8}, {"a": 8, "b": 4})
    assert ledger.hourly_jain() == [pytest.approx(jain([2.0, 0.0]))]  # hour 0 has one team only
    ratios = ledger.share_ratios()
    assert ratios["b"] == 0.0 and ratios["a"] == pytest.approx((8 + 8) / (8 + 4))
    report = ledger.report()
    assert report["jain_hours"] == 1 and report["share_ratio_min"] == 0.0


def test_intervals_are_split_at_hour_edges() -> None:
    ledger = ShareLedger(100.0, {"a": 1, "b": 1})
    ledger.observe(100 + 1800, 100 + 5400, 2, {"a": 1, "b": 1}, {"a": 1, "b": 1})
    assert len(ledger.hourly_jain()) == 2


def test_finish_time_fairness_counts_censored_jobs() -> None:
    shared = {"j1": JobTimes(0, 100), "j2": JobTimes(0, 300), "j3": JobTimes(0, None), "j4": JobTimes(0, 50)}
    private = {"j1": JobTimes(0, 200), "j2": JobTimes(0, 100), "j3": JobTimes(0, 400)}
    ftf = finish_time_fairness(shared, private, shared_end_s=1000, private_end_s=1000)
    # rho: j1 0.5, j2 3.0, j3 1000/400 = 2.5 (censored); j4 has no private run.
    assert ftf.jobs == 3 and ftf.censored == 1
    assert ftf.rho_max == 3.0 and ftf.rho_p50 == 2.5
    assert ftf.share_rho_at_most_1 == pytest.approx(1 / 3)


def test_inversion_is_split_from_quota_waits() -> None:
    """Team a (guarantee 8, holding 4) waits with a 4-GPU and an 8-GPU request while low
    priority holds 8: the 4-GPU one fits a's guarantee (an inversion), the 8-GPU one would
    borrow (a quota wait). A 16-GPU request cannot use the 8 low-priority GPUs: neither."""
    ledger = InversionLedger({"a": 8})
    waiting = {(100, "a"): Counter({4: 1, 8: 1, 16: 1})}
    ledger.observe(3600, waiting, {100: 8}, {"a": 4})
    assert ledger.team("a") == {"inversion_gpu_hours": 4.0, "quota_wait_gpu_hours": 8.0}
    ledger.observe(3600, waiting, {100: 0}, {"a": 4})  # nothing below: no inversion
    assert ledger.report() == {"priority_inversion_gpu_hours": 4.0, "quota_wait_gpu_hours": 8.0}
