"""A live scheduler actor per test, on the session's fake multi-node GPU cluster."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

TEST_POLICY = """
version: 1
policy:
  preemption_grace_s: 30
priority_classes:
  - {name: production-inference, value: 1000, preemptible: false}
  - {name: training, value: 100, preemptible: true, min_runtime_s: 0}
  - {name: exploratory, value: 10, preemptible: true, min_runtime_s: 0}
teams:
  - name: prod
    quotas: [{classes: [inference], guaranteed_gpus: 8}]
  - name: research
    quotas: [{classes: [training, exploratory, batch-fine-tune], guaranteed_gpus: 4}]
  - name: vision
    quotas: [{classes: [training, exploratory, batch-fine-tune], guaranteed_gpus: 4}]
"""


def borrowing_policy(grace_s: float) -> str:
    """The whole cluster is team prod's inference guarantee; research's training only borrows
    it, so any inference request reclaims from training."""
    return f"""
version: 1
policy: {{preemption_grace_s: {grace_s:g}}}
priority_classes:
  - {{name: production-inference, value: 1000, preemptible: false}}
  - {{name: training, value: 100, preemptible: true, min_runtime_s: 0}}
teams:
  - name: prod
    quotas: [{{classes: [inference], guaranteed_gpus: 16}}]
  - name: research
    quotas: [{{classes: [training], guaranteed_gpus: 0}}]
"""


def whole_node_inference(count: int, team: str = "prod") -> list[Any]:
    """Production-inference gangs of one whole 8-GPU node each: what reclaims borrowed GPUs."""
    from switchyard.scheduler.api import WorkloadSubmission
    from switchyard.scheduler.core import PlacementStrategy, WorkloadClass

    return [
        WorkloadSubmission(
            team=team,
            bundles=(8,),
            workload_class=WorkloadClass.INFERENCE,
            priority_class="production-inference",
            strategy=PlacementStrategy.STRICT_PACK,
        )
        for _ in range(count)
    ]


def job_logs(jobs: Any, submission_id: str) -> str:
    """A Ray job's logs, or "" while the Jobs API does not know it yet: the scheduler grants
    the lease first and submits the job after (seen in CI under load: a 404 mid-wait)."""
    try:
        return str(jobs.get_job_logs(submission_id))
    except RuntimeError as exc:
        if "does not exist" in str(exc):
            return ""
        raise


def wait_for(predicate: Callable[[], Any], timeout: float = 30.0, every: float = 0.2) -> Any:
    """The predicate's first truthy value; on timeout the error names the predicate's line and
    its last value (CI's output may keep only the error line)."""
    deadline = time.monotonic() + timeout
    value: Any = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    code = getattr(predicate, "__code__", None)
    where = f" at {Path(code.co_filename).name}:{code.co_firstlineno}" if code is not None else ""
    raise AssertionError(f"condition{where} not met within {timeout}s (last value: {value!r:.300})")


@pytest.fixture
def scheduler_factory(ray_cluster: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    import ray

    from switchyard.cluster.grant_holds import remove_holds
    from switchyard.cluster.scheduler_actor import SchedulerActor

    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "scheduler.yaml").write_text(TEST_POLICY)
    made: list[Any] = []

    def make(policy: str | None = None, **kwargs: Any) -> Any:
        if policy is not None:  # instead of TEST_POLICY
            (tmp_path / "policies" / "scheduler.yaml").write_text(policy)
        name = f"test-scheduler-{uuid.uuid4().hex[:6]}"
        actor = SchedulerActor.options(  # type: ignore[attr-defined]
            name=name, namespace="switchyard", num_cpus=0, max_restarts=-1
        ).remote(str(tmp_path / "policies"), str(tmp_path / "state"), ray_cluster["dashboard_url"], **kwargs)
        ray.get(actor.ping.remote())
        wait_for(lambda: ray.get(actor.status.remote())["total_gpus"] == 16)
        made.append((name, actor))
        return actor

    yield make
    for name, actor in made:
        ray.kill(actor, no_restart=True)
        remove_holds(name)  # detached: the next test's Serve replicas would wait behind them


@pytest.fixture
def platform_scheduler_with(ray_cluster: dict[str, Any], tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """The scheduler under its platform name (jobs and Tune trials find it by that name), with
    the policy given as YAML text; at most one per test."""
    import ray

    from switchyard.cluster.grant_holds import remove_holds
    from switchyard.cluster.record import NAMESPACE, SCHEDULER_ACTOR
    from switchyard.cluster.scheduler_actor import SchedulerActor

    made: list[Any] = []

    def make(policy: str, total_gpus: int = 16, restartable: bool = False, **actor_kwargs: Any) -> Any:
        """`restartable`: Ray restarts the actor after a crash and replays calls in flight, as it
        does the platform's (`deploy.start_scheduler`); `actor_kwargs` go to `SchedulerActor`
        (e.g. `claim_timeout_s`)."""
        assert not made, "one platform scheduler per test"
        (tmp_path / "platform-policies").mkdir()
        (tmp_path / "platform-policies" / "scheduler.yaml").write_text(policy)
        restarts = {"max_restarts": -1, "max_task_retries": 3} if restartable else {}
        actor = SchedulerActor.options(  # type: ignore[attr-defined]
            # On the head: a test removes a GPU node, and the scheduler must not go with it.
            name=SCHEDULER_ACTOR,
            namespace=NAMESPACE,
            num_cpus=0,
            label_selector={"switchyard/node-group": "head"},
            **restarts,
        ).remote(
            str(tmp_path / "platform-policies"),
            str(tmp_path / "platform-state"),
            ray_cluster["dashboard_url"],
            **actor_kwargs,
        )
        made.append(actor)
        wait_for(lambda: ray.get(actor.status.remote())["total_gpus"] == total_gpus)
        return actor

    yield make
    for actor in made:
        ray.kill(actor, no_restart=True)
        remove_holds(SCHEDULER_ACTOR)
