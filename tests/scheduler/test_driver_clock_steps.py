"""The live scheduler's time when its host's wall clock steps (an NTP correction, a VM resumed
after a pause, an operator setting the date). The actor feeds the driver `scheduler_clock`'s
time: the wall clock read once at start, then a monotonic timer. Before stop 48 it fed
`time.time()` as it read: a step forward of an hour ended every grace period (and every
min-runtime protection and claim timeout) at once, and a step back held the GPUs of a job
under notice from its preemptor for an hour longer. No Ray."""

from __future__ import annotations

import math

import pytest
from driver_support import GRACE_S, driver, of, submission

from switchyard.scheduler.driver.clock import scheduler_clock
from switchyard.scheduler.driver.effects import StopClaimedJob

TICK_S = 1.0


class Host:
    """A host's two clocks: a monotonic timer, and a wall clock that runs with it and may step."""

    def __init__(self, wall: float = 0.0) -> None:
        self.elapsed = 0.0
        self._offset = wall

    def wall(self) -> float:
        return self._offset + self.elapsed

    def timer(self) -> float:
        return self.elapsed

    def run(self, seconds: float) -> None:
        self.elapsed += seconds

    def step(self, seconds: float) -> None:
        self._offset += seconds


@pytest.mark.parametrize("step_s", [3600.0, -3600.0, 10.0, -10.0])
def test_the_scheduler_clock_follows_no_step_of_the_wall_clock(step_s: float) -> None:
    host = Host(wall=1_000.0)
    clock = scheduler_clock(-math.inf, host.wall, host.timer)
    host.run(5.0)
    host.step(step_s)
    host.run(2.0)
    assert clock() == 1_007.0


def test_a_restarted_scheduler_starts_from_the_later_of_its_log_and_its_host() -> None:
    host = Host(wall=1_000.0)
    assert scheduler_clock(5_000.0, host.wall, host.timer)() == 5_000.0  # the host's clock went back meanwhile
    assert scheduler_clock(900.0, host.wall, host.timer)() == 1_000.0


@pytest.mark.parametrize("step_s", [3600.0, -3600.0, 60.0, -60.0])
def test_a_grace_period_ends_when_it_is_due_whatever_the_wall_clock_does(step_s: float) -> None:
    """a0 borrows the node; b0 reclaims it at 50 s, so a0 is under notice for the grace period
    (120 s), and does not answer. 30 s into it the host's wall clock steps. The actor ticks once
    a second. a0 is stopped, and b0 admitted, when the grace period is over: not at the first
    tick after a step forward (a0 had no time to checkpoint), not after a step back has passed
    again (b0 waited for as long as the step)."""
    host = Host()
    clock = scheduler_clock(-math.inf, host.wall, host.timer)
    d = driver({"a": 0, "b": 8})
    d.submit(submission("a0", "a", 8), clock())
    d.tick(clock())
    d.claim("a0", "raysubmit_a0")
    host.run(50.0)
    d.submit(submission("b0", "b", 8, "exploratory"), clock())
    d.tick(clock())
    assert d.notice("a0") is not None
    host.run(30.0)
    host.step(step_s)
    stopped_at = None
    while stopped_at is None and host.elapsed < 50.0 + GRACE_S + abs(step_s) + 10 * TICK_S:
        host.run(TICK_S)
        if of(d.tick(clock()), StopClaimedJob):
            stopped_at = host.elapsed
    assert stopped_at == 50.0 + GRACE_S, f"a0 stopped {stopped_at} s in, its grace period ends at {50.0 + GRACE_S}"
    d.tick(clock())
    assert d.lease("b0") is not None
