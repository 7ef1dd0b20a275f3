"""The policy on the live actor: admission order (priority, then fair share), the metrics it
exports (read back from Ray's Prometheus endpoints), and what it asks the autoscaler for.
Workloads carry no entrypoint: the test holds and releases the leases itself."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from switchyard.cluster.scheduler_metrics import WAIT_BUCKETS_S
from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy
from tests.scheduler_live.conftest import wait_for, whole_node_inference

pytestmark = pytest.mark.ray

ORDER_POLICY = """
version: 1
policy: {preemption: none}
priority_classes:
  - {name: training, value: 100, preemptible: true}
  - {name: exploratory, value: 10, preemptible: true}
teams:
  - name: research
    quotas: [{classes: [training, exploratory], guaranteed_gpus: 8}]
  - name: vision
    quotas: [{classes: [training, exploratory], guaranteed_gpus: 8}]
"""


def node(team: str, priority_class: str, description: str = "") -> WorkloadSubmission:
    """A whole node: with 8-GPU gangs on a full cluster, each release admits exactly one."""
    return WorkloadSubmission(
        team=team,
        priority_class=priority_class,
        bundles=(8,),
        strategy=PlacementStrategy.STRICT_PACK,
        description=description,
    )


def test_priority_first_then_the_team_with_the_lower_weighted_usage(scheduler_factory: Callable[..., Any]) -> None:
    actor = scheduler_factory(policy=ORDER_POLICY)
    fills = [node("research", "exploratory") for _ in range(2)]
    for sub in fills:
        ray.get(actor.submit.remote(sub))
    fill_leases = [wait_for(lambda s=s: ray.get(actor.lease.remote(s.workload_id))) for s in fills]
    # Queued in the order FIFO would admit them; the policy admits them in another.
    queued = {
        name: node(team, cls, name)
        for name, team, cls in [
            ("research-exp", "research", "exploratory"),
            ("vision-exp", "vision", "exploratory"),
            ("research-train", "research", "training"),
            ("vision-train", "vision", "training"),
        ]
    }
    for sub in queued.values():
        ray.get(actor.submit.remote(sub))
    wait_for(lambda: len(ray.get(actor.status.remote())["pending"]) == 4)

    def admitted_after_releasing(lease_id: str) -> str:
        before = set(ray.get(actor.status.remote())["pending"])
        ray.get(actor.release.remote(lease_id, True))
        [admitted] = wait_for(lambda: before - set(ray.get(actor.status.remote())["pending"]))
        return by_id[admitted]

    def lease_of(name: str) -> str:
        return str(ray.get(actor.lease.remote(queued[name].workload_id)).lease_id)

    by_id = {sub.workload_id: name for name, sub in queued.items()}
    # research holds both nodes. Training first; vision holds nothing, so vision's goes first.
    assert admitted_after_releasing(fill_leases[0].lease_id) == "vision-train"
    # Now vision holds nothing again and research one node: priority still beats fair share.
    assert admitted_after_releasing(lease_of("vision-train")) == "research-train"
    # Among the exploratory ones, the team using less goes first although it asked later.
    assert admitted_after_releasing(fill_leases[1].lease_id) == "vision-exp"
    assert admitted_after_releasing(lease_of("research-train")) == "research-exp"
    admitted = [e["workload_id"] for e in ray.get(actor.events.remote()) if e["kind"] == "admitted"]
    order = [by_id[w] for w in admitted if w in by_id]
    assert order == ["vision-train", "research-train", "vision-exp", "research-exp"]


METRICS_POLICY = """
version: 1
priority_classes:
  - {name: production-inference, value: 1000, preemptible: false}
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
teams:
  - name: prod
    quotas: [{classes: [inference], guaranteed_gpus: 16}]
  - name: metered       # only this test's workloads: its series are this test's alone
    quotas: [{classes: [training], guaranteed_gpus: 0}]
"""


def scrape() -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every `ray_switchyard_scheduler_*` sample from the Prometheus endpoint of every node's
    metrics agent, by sample name (Ray prefixes application metrics with `ray_`)."""
    samples: dict[str, list[tuple[dict[str, str], float]]] = {}
    for n in ray.nodes():
        if not n["Alive"]:
            continue
        url = f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name.startswith("ray_switchyard_scheduler_"):
                    samples.setdefault(s.name, []).append((dict(s.labels), float(s.value)))
    return samples


def total(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    values = [v for lab, v in samples.get(name, []) if all(lab.get(k) == want for k, want in labels.items())]
    return sum(values) if values else None


def test_metrics_are_exported_and_requeue_time_counts_as_queue_wait(scheduler_factory: Callable[..., Any]) -> None:
    actor = scheduler_factory(policy=METRICS_POLICY)
    prod = whole_node_inference(2)
    ray.get(actor.submit.remote(prod[0]))
    wait_for(lambda: ray.get(actor.lease.remote(prod[0].workload_id)))
    job = node("metered", "training")
    ray.get(actor.submit.remote(job))
    lease = wait_for(lambda: ray.get(actor.lease.remote(job.workload_id)))
    # Preempted (inference reclaims its node), checkpointed, released unfinished: requeued.
    ray.get(actor.submit.remote(prod[1]))
    wait_for(lambda: ray.get(actor.preemption_notice.remote(job.workload_id)))
    assert ray.get(actor.release.remote(lease.lease_id, False)) is True
    prod_lease = wait_for(lambda: ray.get(actor.lease.remote(prod[1].workload_id)))
    time.sleep(1.5)  # requeued for a while: its second wait lands in a higher bucket than its first
    ray.get(actor.release.remote(prod_lease.lease_id, True))
    wait_for(lambda: ray.get(actor.lease.remote(job.workload_id)))
    events = ray.get(actor.events.remote(job.workload_id))
    first, second = [e for e in events if e["kind"] == "admitted"]
    [requeued] = [e for e in events if e["kind"] == "requeued"]
    # The second wait runs from the requeue, not from the original submission.
    assert second["waited_s"] == pytest.approx(second["at"] - requeued["at"], abs=0.01)

    wait_name = "ray_switchyard_scheduler_queue_wait_seconds"
    labels = {"team": "metered", "priority_class": "training", "gang_size": "8+"}

    def exported() -> dict[str, list[tuple[dict[str, str], float]]] | None:
        samples = scrape()
        return samples if total(samples, f"{wait_name}_count", **labels) == 2 else None

    samples = wait_for(exported, timeout=90, every=2)  # the metrics agent exports every ~10 s
    # Both observations, each in its bucket (Ray exports a histogram's sum from bucket
    # midpoints, so the buckets are what identifies the values).
    waits = [first["waited_s"], second["waited_s"]]
    for bound in WAIT_BUCKETS_S:
        exported_count = total(samples, f"{wait_name}_bucket", le=str(float(bound)), **labels)
        assert exported_count == sum(w <= bound for w in waits), (bound, waits)
    assert total(samples, "ray_switchyard_scheduler_preemptions_total", team="metered", reason="reclaim") == 1
    assert (total(samples, "ray_switchyard_scheduler_lost_gpu_seconds_total", team="metered") or 0) > 0
    for name, label in [
        ("ray_switchyard_scheduler_gpus", {"pool": "free"}),
        ("ray_switchyard_scheduler_gpus", {"pool": "leased"}),
        ("ray_switchyard_scheduler_leases", {"state": "running"}),
        ("ray_switchyard_scheduler_leases", {"state": "preempting"}),
        ("ray_switchyard_scheduler_queued_workloads", {"team": "metered"}),
        ("ray_switchyard_scheduler_unleased_gpus", {}),
        ("ray_switchyard_scheduler_team_gpus", {"team": "metered", "kind": "borrowed"}),
        ("ray_switchyard_scheduler_fair_share_ratio", {"team": "metered"}),
        ("ray_switchyard_scheduler_jain_index", {}),
    ]:
        assert total(samples, name, **label) is not None, (name, label, sorted(samples))


def test_autoscaler_is_asked_for_gangs_waiting_for_capacity(scheduler_factory: Callable[..., Any]) -> None:
    from ray.autoscaler._private.constants import AUTOSCALER_RESOURCE_REQUEST_CHANNEL
    from ray.experimental import internal_kv

    def requested() -> list[dict[str, float]] | None:
        # Where `request_resources` puts the request for Ray's (v1) autoscaler to read.
        raw = internal_kv._internal_kv_get(AUTOSCALER_RESOURCE_REQUEST_CHANNEL)
        return None if raw is None else list(json.loads(raw))

    actor = scheduler_factory()
    running = WorkloadSubmission(team="research", bundles=(8,), priority_class="exploratory")
    ray.get(actor.submit.remote(running))
    lease = wait_for(lambda: ray.get(actor.lease.remote(running.workload_id)))
    wait_for(lambda: requested() == [])  # nothing waits: no request, idle nodes may go
    free_before = ray.available_resources().get("GPU", 0)
    big = WorkloadSubmission(team="vision", bundles=(8, 8), priority_class="exploratory")
    ray.get(actor.submit.remote(big))
    # Room for what runs plus the waiting gang: Ray sizes the cluster for the request alone.
    assert wait_for(lambda: requested() == [{"GPU": 8.0}] * 3)
    assert ray.available_resources().get("GPU", 0) == free_before  # and nothing is held meanwhile
    ray.get(actor.release.remote(lease.lease_id, True))
    wait_for(lambda: ray.get(actor.lease.remote(big.workload_id)))
    wait_for(lambda: requested() == [])
