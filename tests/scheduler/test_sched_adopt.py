"""Scheduler.adopt: a workload something else placed (a Serve replica) becomes a lease where it
runs, only onto GPUs free in the ledger and within its quota."""

from __future__ import annotations

import pytest
from sched_support import gang, nodes, policy

from switchyard.scheduler.core import Scheduler


def test_adopt_books_the_gpus_where_it_runs() -> None:
    s = Scheduler(policy({"inf": 4, "a": 4}), nodes(2))
    start = s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n1",), 5)
    assert start.placement == ("n1",) and start.borrowing is False
    assert s.pool.free("n1") == 7 and s.lease_of("r1") is not None
    assert s.pending_count() == 0
    assert s.release(start.lease_id, 9, finished=True) is False
    assert s.pool.free("n1") == 8


def test_adopt_refuses_gpus_the_ledger_gave_to_someone_else() -> None:
    s = Scheduler(policy({"inf": 4, "a": 8}), nodes(1))
    s.submit(gang("t", "a", (8,)), 0)
    assert s.schedule(0).starts
    with pytest.raises(ValueError, match="node 'n0' has 0 GPUs free in the ledger, 1 needed"):
        s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n0",), 1)
    with pytest.raises(ValueError, match="unknown node 'n9'"):
        s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n9",), 1)
    assert s.lease_of("r1") is None and s.pending_count() == 0  # nothing half-done


def test_adopt_refuses_beyond_the_inference_guarantee() -> None:
    # Production inference is not preemptible, so it never borrows: its guarantee is its limit.
    s = Scheduler(policy({"inf": 1, "a": 7}), nodes(1))
    s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n0",), 0)
    with pytest.raises(ValueError, match="over the quota of team 'inf'"):
        s.adopt(gang("r2", "inf", (1,), "production-inference"), ("n0",), 0)
    with pytest.raises(ValueError, match="already holds lease"):
        s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n0",), 0)


def test_adopting_a_queued_preemptor_takes_it_out_of_the_queue() -> None:
    s = Scheduler(policy({"inf": 4, "a": 4}), nodes(1))
    s.submit(gang("own", "a", (4,)), 0)
    s.submit(gang("borrower", "a", (4,)), 0)  # borrows inf's idle guarantee
    leases = {x.workload_id: x for x in s.schedule(0).starts}
    s.submit(gang("r1", "inf", (1,), "production-inference"), 1)
    d = s.schedule(1)
    assert [n.workload_id for n in d.notices] == ["borrower"] and "r1" in s.reservations()
    s.release(leases["borrower"].lease_id, 2)  # it checkpointed and left; Ray placed the replica at once
    start = s.adopt(gang("r1", "inf", (1,), "production-inference"), ("n0",), 2)
    assert start.workload_id == "r1" and "r1" not in s.reservations()
    assert [p.request.workload_id for p in s.pending()] == ["borrower"]  # only the requeued victim waits
    assert s.pool.free("n0") == 3
