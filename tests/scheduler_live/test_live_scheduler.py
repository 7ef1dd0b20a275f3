"""The live scheduler on a fake multi-node GPU cluster: gangs, waiting, preemption, restart, rogue GPUs."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import ray

from switchyard.scheduler.api import WorkloadSubmission
from switchyard.scheduler.core import PlacementStrategy, WorkloadClass
from tests.scheduler_live.conftest import wait_for

pytestmark = pytest.mark.ray


def gang(team: str, bundles: tuple[int, ...], **kw: Any) -> WorkloadSubmission:
    return WorkloadSubmission(team=team, bundles=bundles, **kw)


def granted(actor: Any, workload_id: str, timeout: float = 20.0) -> Any:
    return wait_for(lambda: ray.get(actor.lease.remote(workload_id)), timeout)


def test_eight_gpu_gang_lands_on_one_node_group(
    scheduler_factory: Callable[..., Any], ray_cluster: dict[str, Any]
) -> None:
    actor = scheduler_factory()
    sub = gang("research", (8,), strategy=PlacementStrategy.STRICT_PACK, same_node_group=True)
    ray.get(actor.submit.remote(sub))
    grant = granted(actor, sub.workload_id)
    assert {p.node_group for p in grant.placements} <= {"a", "b"} and len({p.node_id for p in grant.placements}) == 1
    assert grant.placements[0].node_id in ray_cluster["nodes"].values()
    assert grant.borrowing is True  # research's guarantee is 4: the other 4 are borrowed


def test_gang_that_cannot_fit_waits_without_holding_anything(scheduler_factory: Callable[..., Any]) -> None:
    actor = scheduler_factory()
    first = gang("research", (8,), strategy=PlacementStrategy.STRICT_PACK, priority_class="exploratory")
    ray.get(actor.submit.remote(first))
    lease = granted(actor, first.workload_id)
    free_before = ray.available_resources().get("GPU", 0)
    # Needs two whole nodes; one is taken, so it must wait all-or-nothing.
    big = gang("vision", (8, 8), priority_class="exploratory")
    ray.get(actor.submit.remote(big))
    status = wait_for(lambda: (s := ray.get(actor.status.remote())) and big.workload_id in s["pending"] and s)
    assert ray.get(actor.lease.remote(big.workload_id)) is None
    assert ray.available_resources().get("GPU", 0) == free_before  # nothing held for the waiting gang
    assert next(t for t in status["teams"] if t["team"] == "vision")["queued"] == 1
    # What `train list` shows of it: why it waits, its place in its team's queue, its attempt.
    [row] = [w for w in ray.get(actor.list_workloads.remote()) if w["workload_id"] == big.workload_id]
    assert row["state"] == "queued" and row["queue_position"] == 1 and row["attempt"] == 1
    assert row["waiting_for"].startswith("capacity:") and row["waited_s"] >= 0
    assert status["waits"]["vision"]["1h"]["n"] == 1  # `switchyard status`: still waiting counts
    ray.get(actor.release.remote(lease.lease_id, True))
    big_lease = granted(actor, big.workload_id)
    assert len({p.node_id for p in big_lease.placements}) == 2


def test_preemption_notice_requeue_and_resume(scheduler_factory: Callable[..., Any]) -> None:
    from switchyard.cluster.preemption_channel import GcsPreemptionChannel

    actor = scheduler_factory()
    # research: 4 GPUs inside its guarantee on one node, 8 borrowed on the other.
    small = gang("research", (4,), priority_class="training")
    big = gang("research", (8,), priority_class="training", strategy=PlacementStrategy.STRICT_PACK)
    for sub in (small, big):
        ray.get(actor.submit.remote(sub))
    leases = {sub.workload_id: granted(actor, sub.workload_id) for sub in (small, big)}
    serve = gang(
        "prod",
        (8,),
        workload_class=WorkloadClass.INFERENCE,
        priority_class="production-inference",
        strategy=PlacementStrategy.STRICT_PACK,
    )
    ray.get(actor.submit.remote(serve))

    def noticed() -> tuple[str, Any] | None:
        for wid in leases:
            n = ray.get(actor.preemption_notice.remote(wid))
            if n is not None:
                return wid, n
        return None

    victim, notice = wait_for(noticed)
    assert notice.lease_id == leases[victim].lease_id and "for " + serve.workload_id in notice.reason
    sent = wait_for(lambda: GcsPreemptionChannel().poll(victim))  # the training channel got it
    assert sent == notice and sent.job_id == victim  # the very notice the actor keeps, lease id and all
    # The job checkpoints and gives its GPUs back unfinished: it is requeued, inference gets its GPUs.
    ray.get(actor.report_checkpoint.remote(victim))
    assert ray.get(actor.release.remote(leases[victim].lease_id, False)) is True
    # The same call again (a client retry, or Ray replaying it after an actor restart) gets the
    # same answer: before, it said False, and a requeued job believed it had finished.
    assert ray.get(actor.release.remote(leases[victim].lease_id, False)) is True
    prod_lease = granted(actor, serve.workload_id)
    assert len({p.node_id for p in prod_lease.placements}) == 1
    kinds = [e["kind"] for e in ray.get(actor.events.remote(victim))]
    assert kinds[:4] == ["submitted", "admitted", "preemption_notice", "requeued"]
    # When inference is done, the victim is admitted again (it would resume from its checkpoint).
    ray.get(actor.release.remote(prod_lease.lease_id, True))
    granted(actor, victim)
    GcsPreemptionChannel().clear(victim)


def test_restart_recovers_queues_and_leases(scheduler_factory: Callable[..., Any]) -> None:
    actor = scheduler_factory()
    running = gang("research", (4,), priority_class="exploratory")
    ray.get(actor.submit.remote(running))
    lease = granted(actor, running.workload_id)
    waiting = gang("vision", (8, 8), priority_class="exploratory")
    ray.get(actor.submit.remote(waiting))
    wait_for(lambda: waiting.workload_id in ray.get(actor.status.remote())["pending"])
    first_incarnation = ray.get(actor.ping.remote())
    ray.kill(actor, no_restart=False)  # Ray restarts it; it must come back with its state
    wait_for(lambda: _incarnation(actor) not in (None, first_incarnation), timeout=60)
    assert ray.get(actor.lease.remote(running.workload_id)).lease_id == lease.lease_id
    assert waiting.workload_id in ray.get(actor.status.remote())["pending"]


def test_a_call_the_log_cannot_hold_is_refused_and_a_restart_agrees(scheduler_factory: Callable[..., Any]) -> None:
    """Stop 47: an infinite checkpoint interval (a `model_copy` skips pydantic's checks) was
    queued and admitted, but the log could not hold it, so a restart lost it; a string for
    `finished` was read as true."""
    actor = scheduler_factory()
    running = gang("research", (4,), priority_class="exploratory")
    ray.get(actor.submit.remote(running))
    lease = granted(actor, running.workload_id)
    forever = gang("research", (4,), priority_class="exploratory").model_copy(
        update={"checkpoint_interval_s": math.inf}
    )
    with pytest.raises(ray.exceptions.RayTaskError, match="checkpoint_interval_s must be a finite number"):
        ray.get(actor.submit.remote(forever))
    with pytest.raises(ray.exceptions.RayTaskError, match="finished must be true or false"):
        ray.get(actor.release.remote(lease.lease_id, "no"))
    listed = sorted(w["workload_id"] for w in ray.get(actor.list_workloads.remote()))
    assert listed == [running.workload_id]
    first_incarnation = ray.get(actor.ping.remote())
    ray.kill(actor, no_restart=False)
    wait_for(lambda: _incarnation(actor) not in (None, first_incarnation), timeout=60)
    assert sorted(w["workload_id"] for w in ray.get(actor.list_workloads.remote())) == listed
    assert ray.get(actor.lease.remote(running.workload_id)).lease_id == lease.lease_id


def _incarnation(actor: Any) -> float | None:
    try:
        return float(ray.get(actor.ping.remote(), timeout=5))
    except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError, ray.exceptions.GetTimeoutError):
        return None


def test_gpu_use_outside_any_lease_is_detected_and_stopped(scheduler_factory: Callable[..., Any]) -> None:
    from ray.util.placement_group import placement_group, remove_placement_group

    actor = scheduler_factory(stop_unleased_gpus=True)
    rogue = placement_group([{"GPU": 1, "CPU": 0}] * 2, strategy="PACK")
    ray.get(rogue.ready(), timeout=30)
    try:
        report = wait_for(
            lambda: (s := ray.get(actor.status.remote())["outside_leases"]) and s["unleased"] and s, timeout=30
        )
        offender = report["unleased"][0]
        assert offender["gpus"] == 2 and offender["job_id"] == ray.get_runtime_context().get_job_id()
        # Enforcement is on: the rogue placement group is removed.
        wait_for(lambda: ray.util.placement_group_table(rogue)["state"] == "REMOVED", timeout=30)
    finally:
        if ray.util.placement_group_table(rogue)["state"] != "REMOVED":
            remove_placement_group(rogue)


def test_a_grant_nobody_claims_is_taken_back_requeued_then_ended(scheduler_factory: Callable[..., Any]) -> None:
    """Regression: a grant whose launch was lost held its GPUs for ever. Now, unclaimed past the
    claim timeout, its GPUs go back and the workload is requeued (a new attempt); after three
    such grants in a row it ends. A claimed grant is left alone."""
    actor = scheduler_factory(claim_timeout_s=1.5)
    lost = gang("research", (4,), priority_class="exploratory")
    used = gang("research", (2,), priority_class="exploratory")
    for sub in (lost, used):
        ray.get(actor.submit.remote(sub))
    first = granted(actor, lost.workload_id)
    assert ray.get(actor.claim.remote(used.workload_id, "job-that-started")) is not None

    def kinds() -> list[str]:
        return [e["kind"] for e in ray.get(actor.events.remote(lost.workload_id))]

    def regranted() -> Any:
        g = ray.get(actor.lease.remote(lost.workload_id))
        return g if g is not None and g.lease_id != first.lease_id else None

    again = wait_for(regranted)
    assert kinds()[:4] == ["submitted", "admitted", "claim_timeout", "requeued"]
    assert again.lease_id.endswith("#2")
    wait_for(lambda: "ended" in kinds(), timeout=30)
    assert kinds().count("claim_timeout") == 3
    rows = {w["workload_id"]: w for w in ray.get(actor.list_workloads.remote())}
    assert rows[lost.workload_id]["state"] == "done"
    assert ray.get(actor.lease.remote(lost.workload_id)) is None  # nothing held for it
    assert ray.get(actor.lease.remote(used.workload_id)) is not None  # claimed: never timed out


def test_a_leased_job_holding_more_gpus_than_its_lease_is_reported(scheduler_factory: Callable[..., Any]) -> None:
    """Regression: enforcement only checked that a job claimed some lease, not how many GPUs it
    holds; a job with a 2-GPU lease could hold 4."""
    from ray.util.placement_group import placement_group, remove_placement_group

    actor = scheduler_factory()
    small = gang("research", (2,), priority_class="exploratory")
    ray.get(actor.submit.remote(small))
    granted(actor, small.workload_id)
    job = ray.get_runtime_context().get_job_id()
    assert ray.get(actor.claim.remote(small.workload_id, job)) is not None
    greedy = placement_group([{"GPU": 1, "CPU": 0}] * 4, strategy="PACK")
    ray.get(greedy.ready(), timeout=30)
    try:
        report = wait_for(
            lambda: (s := ray.get(actor.status.remote())["outside_leases"]) and s["over_lease"] and s, timeout=30
        )
        [over] = report["over_lease"]
        assert (over["job_id"], over["leased_gpus"], over["excess"]) == (job, 2, over["gpus"] - 2)
        assert over["gpus"] >= 4 and report["over_lease_gpus"] == over["excess"]
        assert not report["unleased"]  # it has a lease: over it, not outside one
    finally:
        remove_placement_group(greedy)
