"""Small clusters and policies for the scheduler core tests."""

from __future__ import annotations

from switchyard.scheduler.core import (
    DEFAULT_PRIORITY_CLASSES,
    GangRequest,
    Node,
    PlacementStrategy,
    PolicyKnobs,
    Quota,
    SchedulerPolicy,
    Team,
    WorkloadClass,
)

ALL_CLASSES = frozenset(WorkloadClass)


def nodes(count: int, gpus: int = 8, per_group: int = 2) -> list[Node]:
    return [Node(f"n{i}", gpus, f"g{i // per_group}", f"r{i // per_group}") for i in range(count)]


def policy(guarantees: dict[str, int], knobs: PolicyKnobs | None = None) -> SchedulerPolicy:
    teams = tuple(Team(t, (Quota(ALL_CLASSES, g),), float(max(g, 1))) for t, g in guarantees.items())
    return SchedulerPolicy(DEFAULT_PRIORITY_CLASSES, teams, knobs or PolicyKnobs())


def gang(
    wid: str,
    team: str,
    bundles: tuple[int, ...],
    priority: str = "exploratory",
    *,
    checkpoint_s: float | None = None,
    strategy: PlacementStrategy = PlacementStrategy.PACK,
    same_group: bool = False,
) -> GangRequest:
    classes = {
        "production-inference": WorkloadClass.INFERENCE,
        "training": WorkloadClass.TRAINING,
        "batch": WorkloadClass.BATCH_FINE_TUNE,
        "exploratory": WorkloadClass.EXPLORATORY,
    }
    return GangRequest(wid, team, classes[priority], priority, bundles, strategy, same_group, None,
                       checkpoint_s)
