"""A wall-clock reading that never steps: a time taken once, advanced by a monotonic timer.

A host's wall clock steps (an NTP correction, a VM resumed after a pause, an operator setting
the date), and the clocks of two hosts disagree. Where a decision compares a stored time with
"now" (a grace period's end, a key's expiry), `now` is read from one trusted clock once (the
host's at a scheduler's start, the database's when a key snapshot is taken) and counted on from
there; steps of the host's wall clock after that do not move it.
"""

from __future__ import annotations

import time
from collections.abc import Callable


class SteadyClock:
    def __init__(self, start: float, timer: Callable[[], float] = time.monotonic) -> None:
        """`start`: the time now, in seconds since the epoch, by the clock to be trusted."""
        self._timer = timer
        self._origin = start - timer()

    def __call__(self) -> float:
        return self._origin + self._timer()
