"""What the scheduler asks Ray's autoscaler for: room for the gangs that wait for capacity.

`ray.autoscaler.sdk.request_resources(bundles=...)` asks for a cluster on which the given
shapes fit *together with nothing else* (a request of 100 CPUs while 45 are in use adds
nodes up to 100, not 145), and each call replaces the last. So the request is every leased
bundle plus every bundle of the gangs that wait for capacity, and it is cleared (an empty
request) once no gang waits: idle nodes may then scale down. No placeholder placement group
is created, so nothing is held for a gang while it waits. Pure: the actor makes the Ray call.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from switchyard.scheduler.core import GangRequest

NODE_GROUP_LABEL = "switchyard/node-group"


@dataclass(frozen=True)
class CapacityRequest:
    """The arguments of one `request_resources` call; empty clears the previous request."""

    bundles: tuple[dict[str, float], ...] = ()
    label_selectors: tuple[dict[str, str], ...] = ()  # per bundle; {} where any node will do

    def __bool__(self) -> bool:
        return bool(self.bundles)


def capacity_request(leased: Iterable[tuple[int, ...]], waiting: Iterable[GangRequest]) -> CapacityRequest:
    """Bundles to request: the GPUs of every lease (`leased`: each lease's bundles) plus every
    bundle of the gangs waiting for capacity, in a stable order so an unchanged cluster gives
    an equal request; a gang pinned to a node group asks for nodes with that group's label."""
    waiting = sorted(waiting, key=lambda g: g.workload_id)
    if not waiting:
        return CapacityRequest()
    bundles: list[dict[str, float]] = []
    selectors: list[dict[str, str]] = []
    for lease_bundles in sorted(leased):
        for gpus in lease_bundles:
            bundles.append({"GPU": float(gpus)})
            selectors.append({})
    for gang in waiting:
        selector = {NODE_GROUP_LABEL: gang.node_group} if gang.node_group else {}
        for gpus in gang.bundles:
            bundles.append({"GPU": float(gpus)})
            selectors.append(dict(selector))
    return CapacityRequest(tuple(bundles), tuple(selectors))
