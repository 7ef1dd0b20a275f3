"""What the scheduler asks Ray's autoscaler for: room for the gangs that wait for capacity.

`ray.autoscaler.sdk.request_resources(bundles=...)` asks for a cluster on which the given
shapes fit *together with nothing else* (a request of 100 CPUs while 45 are in use adds
nodes up to 100, not 145), and each call replaces the last. So the request is every leased
bundle plus every bundle of the gangs that wait for capacity, and it is cleared (an empty
request) once no gang waits: idle nodes may then scale down. No placeholder placement group
is created, so nothing is held for a gang while it waits. Pure: the actor makes the Ray call.

Where the policy declares GPU types, each bundle, leased or waiting, carries its type as a
label selector (`switchyard/gpu-type`, the label the actor reads a node's type from): Ray
would otherwise count an idle node of another type as room for it and add nothing.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from switchyard.scheduler.core.explain import CapacityNeed

NODE_GROUP_LABEL = "switchyard/node-group"
RACK_LABEL = "switchyard/rack"
GPU_TYPE_LABEL = "switchyard/gpu-type"


@dataclass(frozen=True)
class CapacityRequest:
    """The arguments of one `request_resources` call; empty clears the previous request."""

    bundles: tuple[dict[str, float], ...] = ()
    label_selectors: tuple[dict[str, str], ...] = ()  # per bundle; {} where any node will do

    def __bool__(self) -> bool:
        return bool(self.bundles)


def capacity_request(
    leased: Iterable[tuple[tuple[int, ...], str]], waiting: Iterable[CapacityNeed]
) -> CapacityRequest:
    """Bundles to request: the GPUs of every lease (`leased`: each lease's bundles and GPU
    type) plus every bundle of the gangs waiting for capacity, in a stable order so an
    unchanged cluster gives an equal request; a gang pinned to a node group asks for nodes
    with that group's label, and a typed bundle for nodes of its type."""
    needs = sorted(waiting, key=lambda n: n.request.workload_id)
    if not needs:
        return CapacityRequest()
    bundles: list[dict[str, float]] = []
    selectors: list[dict[str, str]] = []
    for lease_bundles, gpu_type in sorted(leased):
        for gpus in lease_bundles:
            bundles.append({"GPU": float(gpus)})
            selectors.append({GPU_TYPE_LABEL: gpu_type} if gpu_type else {})
    for need in needs:
        gang = need.request
        selector = {NODE_GROUP_LABEL: gang.node_group} if gang.node_group else {}
        if need.gpu_type:
            selector[GPU_TYPE_LABEL] = need.gpu_type
        for gpus in gang.bundles:
            bundles.append({"GPU": float(gpus)})
            selectors.append(dict(selector))
    return CapacityRequest(tuple(bundles), tuple(selectors))
