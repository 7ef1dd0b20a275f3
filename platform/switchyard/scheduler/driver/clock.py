"""The live scheduler's time: a wall-clock reading that never steps.

Every time the scheduler keeps is a wall-clock time in seconds since the epoch (a grace
period's end, a grant's claim deadline, when a workload was queued, a lease's min-runtime): it
is written to the log and read back after a restart, and shown to operators. But the host's
wall clock steps (an NTP correction, a VM resumed after a pause, an operator setting the date).
Fed to the driver as it read, a step of an hour forward ended every grace period and every
min-runtime protection at once and made every queued gang look starved; a step back froze the
passes, node refreshes and deadlines that wait on time, for as long as the step (stop 48).

So the scheduler reads the wall clock once, when it starts, and counts from there on a
monotonic timer. A restarted scheduler starts from the later of its host's wall clock and the
last time its log holds: its time never runs backwards, whatever the host's clock did while
it was down. A step while it runs is not followed until it restarts.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from switchyard.steady_clock import SteadyClock


def scheduler_clock(
    not_before: float,
    wall: Callable[[], float] = time.time,
    timer: Callable[[], float] = time.monotonic,
) -> SteadyClock:
    """`not_before`: the last time the scheduler's log holds (-inf: an empty log)."""
    return SteadyClock(max(wall(), not_before), timer)
