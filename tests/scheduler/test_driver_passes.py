"""Event-driven passes: the driver says when a tick must run a scheduling pass (`passes`), and a
tick it skips would have decided nothing, except the clock-driven rules, bounded by
`idle_pass_s`. The randomized test prints its seed (`SWITCHYARD_PASS_SEEDS=...` replays)."""

from __future__ import annotations

import copy
import os
import random

import pytest
from driver_support import GRACE_S, admit, driver, of, submission

from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.effects import JournalEvent, LaunchJob, SendNotice
from switchyard.scheduler.driver.passes import IDLE_PASS_S


def test_an_idle_scheduler_does_not_pass_every_tick() -> None:
    d = driver({"a": 8}, node_count=1)
    assert d.pass_due(0.0)  # a new (or restarted) driver passes first
    d.tick(0.0)
    for now in (0.25, 0.5, 10.0, 3600.0):
        assert not d.pass_due(now), f"nothing queued, no notice, no grant: no pass at {now}"


def test_an_event_makes_the_next_tick_pass() -> None:
    d = driver({"a": 8}, node_count=1)
    d.tick(0.0)
    inputs.apply(d, inputs.submit(submission("w", "a", 8), 1.0, "r1"))
    assert d.pass_due(1.25)
    d.tick(1.25)
    assert d.lease("w") is not None and not d.pass_due(1.5)
    inputs.apply(d, inputs.release(d.lease("w").lease_id, True, 2.0))  # type: ignore[union-attr]
    assert d.pass_due(2.25)


def test_a_queued_workload_that_cannot_start_is_looked_at_every_idle_pass() -> None:
    d = driver({"a": 8}, node_count=1)
    admit(d, submission("big", "a", 8), 0.0)
    inputs.apply(d, inputs.submit(submission("waits", "a", 8), 1.0, "r"))
    d.tick(1.0)
    assert d.lease("waits") is None
    assert not d.pass_due(1.0 + IDLE_PASS_S - 0.01)
    assert d.pass_due(1.0 + IDLE_PASS_S)


def test_a_grace_period_ending_makes_a_pass_due_and_the_pass_stops_the_lease() -> None:
    d = driver({"a": 0, "b": 8}, node_count=1)
    admit(d, submission("borrower", "a", 8), 0.0)  # b's guarantee, borrowed
    inputs.apply(d, inputs.submit(submission("owner", "b", 8, "exploratory"), 50.0, "r"))
    effects = d.tick(50.0)
    assert len(of(effects, SendNotice)) == 1 and d.notice("borrower") is not None
    d._passes.idle_pass_s = 1e9  # only the deadline can make a pass due now
    deadline = 50.0 + GRACE_S
    assert not d.pass_due(deadline - 0.01)
    assert d.pass_due(deadline)
    stopped = d.tick(deadline)
    assert [e.kind.value for e in of(stopped, JournalEvent) if e.workload_id == "borrower"][:1] == ["stop_order"]


def test_a_grant_past_its_claim_timeout_makes_a_pass_due() -> None:
    d = driver({"a": 8}, node_count=1, claim_timeout_s=60.0)
    inputs.apply(d, inputs.submit(submission("w", "a", 8, entrypoint="python x.py"), 0.0, "r"))
    assert of(d.tick(0.0), LaunchJob)
    assert not d.pass_due(60.0)
    assert d.pass_due(60.01)
    kinds = [e.kind.value for e in of(d.tick(60.01), JournalEvent)]
    assert kinds[:2] == ["claim_timeout", "requeued"]


def test_a_finished_workload_past_retention_makes_a_pass_due() -> None:
    d = driver({"a": 8}, node_count=1)
    d._retention_s = 100.0
    grant = admit(d, submission("w", "a", 8), 0.0)
    d.release(grant.lease_id, True, 1.0)
    d.tick(1.0)
    assert not d.pass_due(100.0)
    assert d.pass_due(101.5)
    d.tick(101.5)
    assert "w" not in d.state.submissions


def decided_something(d: Driver, now: float) -> list[str]:
    """What a pass at `now` would journal, on a copy."""
    probe = copy.deepcopy(d)
    return [f"{e.kind.value}:{e.workload_id}" for e in of(probe.tick(now), JournalEvent)]


SEEDS = [int(s) for s in os.environ.get("SWITCHYARD_PASS_SEEDS", "0,1,2,3").split(",")]


@pytest.mark.parametrize("seed", SEEDS)
def test_a_skipped_tick_would_have_decided_nothing_but_clock_rules_within_the_idle_bound(seed: int) -> None:
    """Random submits, cancels, releases, checkpoints and claims on a 3-node cluster, a tick every
    0.25 s taken only when `pass_due`. At every skipped tick, a pass on a copy must decide
    nothing, or only what a clock-driven rule makes due while work is queued and the last pass
    is less than `idle_pass_s` ago; never a stop past a grace deadline or a claim timeout."""
    rng = random.Random(seed)
    d = driver({"a": 8, "b": 8, "c": 8}, node_count=3, claim_timeout_s=30.0)
    d._retention_s = 40.0
    now, n, skipped, stops = 0.0, 0, 0, 0
    classes = ["training", "exploratory", "production-inference"]
    for step in range(1000):  # 250 s: past the 120 s grace period
        now = round(now + 0.25, 2)
        roll = rng.random()
        if roll < 0.08:
            n += 1
            sub = submission(f"w{n}", rng.choice("abc"), rng.choice([1, 2, 4, 8]), rng.choice(classes))
            if rng.random() < 0.3:
                sub = sub.model_copy(update={"entrypoint": "python x.py"})
            inputs.apply(d, inputs.submit(sub, now, f"s{n}"))
        elif roll < 0.10 and set(d.state.grants) - set(d.state.notices):  # a noticed job may miss its deadline
            wid = rng.choice(sorted(set(d.state.grants) - set(d.state.notices)))
            inputs.apply(d, inputs.release(d.state.grants[wid].lease_id, rng.random() < 0.7, now))
        elif roll < 0.14 and d.state.submissions:
            wid = rng.choice(sorted(d.state.submissions))
            if wid not in d.state.finished_at:
                inputs.apply(d, inputs.cancel(wid, now, f"c{step}"))
        elif roll < 0.13 and d.state.notices:
            inputs.apply(d, inputs.checkpoint_reported(rng.choice(sorted(d.state.notices)), now, f"k{step}"))
        elif roll < 0.20 and d.state.grants:
            wid = rng.choice(sorted(d.state.grants))
            if rng.random() < 0.5:
                inputs.apply(d, inputs.claim(wid, f"job-{wid}"))
        if d.pass_due(now):
            stops += len([e for e in of(inputs.apply(d, inputs.tick(now))[1], JournalEvent) if e.kind == "stop_order"])
            continue
        skipped += 1
        would = decided_something(d, now)
        if not would:
            continue
        context = f"seed {seed} step {step} t={now}: a skipped tick would journal {would}"
        assert not any(k.startswith(("stop_order", "claim_timeout")) for k in would), context
        assert d.state.core.pending_count() > 0, context
        assert now - d._passes.last_pass < IDLE_PASS_S, context
    assert skipped > 300, f"seed {seed}: only {skipped} ticks skipped: the trigger is not event-driven"
    assert stops, f"seed {seed}: no grace period ran out: the run did not test the deadline"
