"""The scheduler's pure policy core: no Ray, no clock, no I/O besides loading scheduler.yaml.

Driven event by event by the simulator (`switchyard.scheduler.sim`) and by the live Ray
scheduler; see docs/scheduler.md for the concepts.
"""

from switchyard.scheduler.core.model import (
    Decisions,
    GangRequest,
    Lease,
    LeaseStart,
    LeaseState,
    Node,
    PlacementStrategy,
    PreemptionDecision,
    PreemptionReason,
    Reservation,
    StopOrder,
    WorkloadClass,
)
from switchyard.scheduler.core.policy import (
    DEFAULT_PRIORITY_CLASSES,
    Ordering,
    PolicyKnobs,
    PreemptionMode,
    PriorityClass,
    Quota,
    SchedulerPolicy,
    Team,
)
from switchyard.scheduler.core.scheduler import Scheduler

__all__ = [
    "DEFAULT_PRIORITY_CLASSES",
    "Decisions",
    "GangRequest",
    "Lease",
    "LeaseStart",
    "LeaseState",
    "Node",
    "Ordering",
    "PlacementStrategy",
    "PolicyKnobs",
    "PreemptionDecision",
    "PreemptionMode",
    "PreemptionReason",
    "PriorityClass",
    "Quota",
    "Reservation",
    "Scheduler",
    "SchedulerPolicy",
    "StopOrder",
    "Team",
    "WorkloadClass",
]
