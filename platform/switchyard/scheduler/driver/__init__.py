"""The live scheduler's pure driver: the policy core plus the state and rules around it.

`Driver` takes events (submit, cancel, claim, release, the node set, checkpoints, ticks, launch
outcomes) with the time passed in, and returns `effects` for the Ray adapter
(`switchyard.cluster.scheduler_actor`) to carry out. `LiveState` is what the adapter persists;
`views` are the read-only reports. No Ray, no clock, no I/O. See docs/live_scheduler.md.
"""

from switchyard.scheduler.driver.driver import Driver
from switchyard.scheduler.driver.state import LaunchedJob, LiveState

__all__ = ["Driver", "LaunchedJob", "LiveState"]
