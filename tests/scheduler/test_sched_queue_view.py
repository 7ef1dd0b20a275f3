"""What `train list` and `switchyard status` say about the queue, from the core's own state."""

from __future__ import annotations

from switchyard.scheduler.core.model import GangRequest, PendingWorkload, WorkloadClass
from switchyard.scheduler.core.pending import PendingExplanation, PendingReason
from switchyard.scheduler.queue_view import WaitLog, queue_rows


def pending(
    workload: str, team: str, queued_at: float, *, priority: str = "training", attempts: int = 0
) -> PendingWorkload:
    request = GangRequest(workload, team, WorkloadClass.TRAINING, priority, (8,))
    return PendingWorkload(request, queued_at, queued_at, attempts=attempts)


def test_each_waiting_workload_gets_its_wait_place_attempt_and_reason() -> None:
    queue = [
        pending("r-late", "research", 300.0),
        pending("v-1", "vision", 100.0),
        pending("r-early", "research", 200.0, attempts=2),  # requeued twice after running
        pending("r-exp", "research", 50.0, priority="exploratory"),
    ]

    def explain(p: PendingWorkload) -> PendingExplanation:
        return PendingExplanation(PendingReason.CAPACITY, f"needs {p.request.gpus} GPUs, 0 free")

    rows = queue_rows(queue, explain, now=1000.0)
    assert {w: r.position for w, r in rows.items()} == {"r-early": 1, "r-late": 2, "v-1": 1, "r-exp": 1}
    assert rows["r-early"].attempt == 3 and rows["r-late"].attempt == 1
    assert rows["v-1"].waited_s == 900.0
    assert (rows["r-late"].reason, rows["r-late"].detail) == ("capacity", "needs 8 GPUs, 0 free")


def test_wait_percentiles_cover_the_window_and_the_still_waiting() -> None:
    log = WaitLog()
    day = 86400.0
    log.record("research", at=day - 7200, waited_s=10.0)  # in the day, not the hour
    for n in range(1, 11):
        log.record("research", at=day - 60, waited_s=float(n * 60))
    summary = log.summary(now=day, queued=[("vision", 5 * day)])  # admitted nothing, waiting for days
    hour, whole_day = summary["research"]["1h"], summary["research"]["1d"]
    assert (hour["n"], hour["p50"], hour["p90"], hour["max"]) == (10, 300.0, 540.0, 600.0)
    assert whole_day["n"] == 11 and whole_day["max"] == 600.0
    assert summary["vision"]["1h"] == {"p50": 5 * day, "p90": 5 * day, "max": 5 * day, "n": 1.0}


def test_the_log_keeps_one_day() -> None:
    log = WaitLog()
    for hour in range(48):
        log.record("research", at=hour * 3600.0, waited_s=1.0)
    assert len(log.admissions) == 25  # the last day, both ends included
