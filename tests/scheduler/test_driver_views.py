"""What `train list`, `status`, the gauges and the GPU audit read from the driver's state."""

from __future__ import annotations

from driver_support import admit, driver, submission

from switchyard.scheduler.driver import views


def test_workload_rows_show_queued_running_and_done_workloads() -> None:
    d = driver({"a": 8, "b": 8}, node_count=2)
    d.submit(submission("run", "a", 8, entrypoint="go"), 0)
    d.tick(0)
    d.job_launched("run", "run-1")
    d.submit(submission("wait", "b", 16), 5)  # never fits on one 8-GPU node
    done = admit(d, submission("done", "b", 1, "exploratory"), 6)
    d.release(done.lease_id, True, 7)
    rows = {r["workload_id"]: r for r in views.workload_rows(d.state, 20)}
    assert rows["run"]["state"] == "running" and rows["run"]["ray_job"] == "run-1" and rows["run"]["attempt"] == 1
    assert rows["done"]["state"] == "done" and rows["done"]["ray_job"] is None
    waiting = rows["wait"]
    assert waiting["state"] == "queued" and waiting["waited_s"] == 15.0 and waiting["queue_position"] == 1
    assert waiting["attempt"] == 1 and waiting["waiting_for"].startswith("capacity:")


def test_status_counts_gpus_and_waits_of_admitted_and_still_queued_workloads() -> None:
    d = driver({"a": 8, "b": 8}, node_count=1)
    admit(d, submission("a0", "a", 8), 0)
    d.submit(submission("b0", "b", 8, "exploratory"), 10)
    view = views.cluster_view(d.state, 40)
    assert (view["total_gpus"], view["free_gpus"], view["pending"]) == (8, 0, ["b0"])
    assert [(lease["team"], lease["gpus"], lease["state"]) for lease in view["leases"]] == [("a", 8, "running")]
    waits = views.wait_summary(d.state, 40)
    assert waits["b"]["1h"]["n"] == 1 and waits["b"]["1h"]["max"] == 30.0  # still waiting counts


def test_leased_gpus_are_summed_per_ray_job_for_the_audit() -> None:
    """A sweep's driver job claims one lease per trial; an unclaimed lease counts for no job."""
    d = driver({"a": 16}, node_count=2)
    for trial, gpus in (("t1", 4), ("t2", 2), ("solo", 1), ("unclaimed", 1)):
        admit(d, submission(trial, "a", gpus), 0)
    d.claim("t1", "sweep")
    d.claim("t2", "sweep")
    d.claim("solo", "job")
    assert views.leased_gpus_by_job(d.state) == {"sweep": 6, "job": 1}


def test_gauges_count_gpus_leases_by_state_and_queues_by_team() -> None:
    d = driver({"a": 0, "b": 8})
    admit(d, submission("a0", "a", 8), 0)
    d.submit(submission("b0", "b", 8, "exploratory"), 50)
    d.tick(50)  # a0 is noticed
    readings = views.gauge_readings(d.state, d.tally, 60)
    assert (readings.free_gpus, readings.leased_gpus) == (0, 8)
    assert readings.leases == {"running": 0, "preempting": 1}
    assert readings.queued == {"a": 0, "b": 1}


def test_the_autoscaler_sees_leased_bundles_and_the_gangs_waiting_for_capacity() -> None:
    d = driver({"a": 16, "b": 16}, node_count=1)
    admit(d, submission("a0", "a", 8), 0)
    d.submit(submission("b0", "b", 8), 1)  # within b's guarantee, but no GPU is left
    assert list(views.leased_bundles(d.state)) == [((8,), "")]
    assert [n.request.workload_id for n in views.waiting_for_capacity(d.state)] == ["b0"]
