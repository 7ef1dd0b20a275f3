"""The typed scheduler client's retries: bounded, backed off, and idempotent across a restart.

The actor is a real driver behind a fake transport that can be down (the call never reached
it) or lose the answer (the event was applied and logged, then the actor died before replying:
what a SIGKILL after the log append looks like to the caller)."""

from __future__ import annotations

from typing import Any

import pytest
from driver_support import driver, submission

from switchyard.cluster.scheduler_client import RetryPolicy, SchedulerClient, SchedulerUnavailable
from switchyard.scheduler.api import ReleaseOutcome
from switchyard.scheduler.driver import Driver, inputs
from switchyard.scheduler.driver.effects import Effect, EventKind, JournalEvent, SaveState, SendNotice

NOW = 1.0


class DriverBehindActor:
    """The actor's mutations as the driver events it logs; `down` tries fail before the
    driver sees them, `lose_answers` tries fail after it applied them."""

    def __init__(self, d: Driver) -> None:
        self.driver = d
        self.calls: list[tuple[str, tuple[Any, ...]]] = []
        self.sent: list[tuple[str, tuple[Any, ...]]] = []
        self.down = 0
        self.lose_answers = 0
        self.effects: list[tuple[str, list[Effect]]] = []  # what the driver asked for, per try

    def call(self, method: str, args: tuple[Any, ...], timeout_s: float | None) -> Any:
        self.calls.append((method, args))
        if self.down:
            self.down -= 1
            raise SchedulerUnavailable("actor restarting")
        answer = self._apply(method, args)
        if self.lose_answers:
            self.lose_answers -= 1
            raise SchedulerUnavailable("actor died after its log append")
        return answer

    def send(self, method: str, args: tuple[Any, ...]) -> None:
        self.sent.append((method, args))

    def _apply(self, method: str, args: tuple[Any, ...]) -> Any:
        if method == "lease":
            return self.driver.lease(*args)
        if method == "submit":
            record = inputs.submit(args[0], NOW, args[1])
        elif method == "cancel":
            record = inputs.cancel(args[0], NOW, args[1])
        elif method == "claim":
            record = inputs.claim(*args)
        elif method == "report_checkpoint":
            record = inputs.checkpoint_reported(args[0], NOW, args[1])
        elif method == "report_resume":
            record = inputs.resume_reported(*args[:3], NOW, args[3])
        elif method in ("cordon", "uncordon"):
            record = getattr(inputs, method)(args[0], NOW, args[1])
        elif method == "drain":
            record = inputs.drain(args[0], args[1], NOW, args[2])
        else:
            assert method == "release", method
            record = inputs.release(args[0], args[1], NOW)
        answer, effects = inputs.apply(self.driver, record)
        self.effects.append((method, effects))
        return answer is ReleaseOutcome.REQUEUED if method == "release" else answer


def client_of(actor: DriverBehindActor, **retry: Any) -> tuple[SchedulerClient, list[float]]:
    slept: list[float] = []
    return SchedulerClient(actor, RetryPolicy(**retry), sleep=slept.append, clock=lambda: sum(slept)), slept


def admitted(actor: DriverBehindActor, client: SchedulerClient, wid: str) -> Any:
    client.submit(submission(wid, "a"))
    inputs.apply(actor.driver, inputs.tick(NOW))
    grant = client.lease(wid)
    assert grant is not None
    return grant


def test_submit_whose_answer_was_lost_is_retried_with_its_request_id_and_done_once() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    actor.lose_answers = 1

    assert client.submit(submission("w1", "a")) == "w1"  # without the same id: "already submitted"

    assert [m for m, _ in actor.calls] == ["submit", "submit"]
    assert actor.calls[0][1][1] == actor.calls[1][1][1]
    assert [p.request.workload_id for p in actor.driver.state.core.pending()] == ["w1"]


def test_each_submit_carries_a_fresh_request_id() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    client.submit(submission("w1", "a"))
    client.submit(submission("w2", "a"))
    ids = [args[1] for _, args in actor.calls]
    assert len(set(ids)) == 2 and all(ids)


def test_cancel_retried_after_a_lost_answer_does_not_fail_on_the_gone_workload() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    client.submit(submission("w1", "a"))
    actor.lose_answers = 1
    client.cancel("w1")  # the retry would raise KeyError for w1 without its request id
    assert actor.driver.state.core.pending_count() == 0


def test_claim_and_release_retried_after_restarts_give_the_first_answers() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    grant = admitted(actor, client, "w1")

    actor.lose_answers = 1
    assert client.claim("w1", "job-1") == grant
    actor.lose_answers = 1
    assert client.release(grant.lease_id, finished=True) is False  # over, answered twice alike

    assert [m for m, _ in actor.calls[-4:]] == ["claim", "claim", "release", "release"]
    assert actor.driver.state.released == {grant.lease_id: False}
    assert actor.driver.lease("w1") is None


def test_a_down_actor_is_retried_with_doubling_backoff_up_to_the_cap() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, slept = client_of(actor, first_backoff_s=0.1, max_backoff_s=0.3, attempts=10)
    actor.down = 4
    assert client.submit(submission("w1", "a")) == "w1"
    assert slept == [0.1, 0.2, 0.3, 0.3]


def test_retries_stop_after_the_last_attempt() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, slept = client_of(actor, attempts=3)
    actor.down = 100
    with pytest.raises(SchedulerUnavailable):
        client.lease("w1")
    assert len(actor.calls) == 3 and len(slept) == 2


def test_retries_stop_before_the_deadline() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, slept = client_of(actor, first_backoff_s=1.0, max_backoff_s=1.0, deadline_s=2.5, attempts=100)
    actor.down = 100
    with pytest.raises(SchedulerUnavailable):
        client.lease("w1")
    assert sum(slept) <= 2.5 and len(actor.calls) == 3


def test_a_refused_call_is_not_retried() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    client.submit(submission("w1", "a"))
    with pytest.raises(ValueError):
        client.submit(submission("w1", "a"))  # a new request for a workload already queued
    assert len(actor.calls) == 2


def test_an_advisory_report_can_be_sent_without_waiting() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    client.report_checkpoint("w1", wait=False)
    client.report_resume("w1", 3, "s3://ck/3", wait=False)
    [(m1, (w1, id1)), (m2, (w2, step, ck, id2))] = actor.sent
    assert (m1, w1, m2, w2, step, ck) == ("report_checkpoint", "w1", "report_resume", "w1", 3, "s3://ck/3")
    assert id1 and id2 and id1 != id2  # sent without waiting, still with request ids
    assert actor.calls == []


def test_a_checkpoint_report_retried_after_a_lost_answer_keeps_the_first_time() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    admitted(actor, client, "w1")
    lease = actor.driver.state.core.lease_of("w1")
    assert lease is not None
    actor.lose_answers = 1
    client.report_checkpoint("w1")
    [(_, first), (_, retry)] = [c for c in actor.calls if c[0] == "report_checkpoint"]
    assert first == retry and lease.last_checkpoint_at == NOW
    assert [e for m, e in actor.effects if m == "report_checkpoint"] == [[SaveState()], []]  # the retry: nothing


def test_a_resume_report_retried_after_a_lost_answer_is_journaled_once() -> None:
    actor = DriverBehindActor(driver({"a": 8}))
    client, _ = client_of(actor)
    actor.lose_answers = 1
    client.report_resume("w1", 3, "s3://ck/3")
    assert len(actor.calls) == 2
    resumed = [e for _, es in actor.effects for e in es if isinstance(e, JournalEvent) and e.kind is EventKind.RESUMED]
    assert [dict(e.details) for e in resumed] == [{"step": 3, "checkpoint": "s3://ck/3"}]


def test_a_drain_retried_after_a_lost_answer_sends_each_notice_once() -> None:
    actor = DriverBehindActor(driver({"a": 16}, node_count=2))
    client, _ = client_of(actor)
    grant = admitted(actor, client, "w1")
    node = grant.placements[0].node_id
    actor.lose_answers = 1
    report = client.drain(node)
    assert report.node == node and report.leaving == ("w1",)  # the retry's answer: noticed by the first try
    assert [e.notice.job_id for _, es in actor.effects for e in es if isinstance(e, SendNotice)] == ["w1"]
    drained = [
        e for _, es in actor.effects for e in es if isinstance(e, JournalEvent) and e.kind is EventKind.NODE_DRAINED
    ]
    assert len(drained) == 1  # the retry was answered, not drained again
    actor.lose_answers = 1
    assert client.uncordon(node[:2]) == node and client.cordon(node) == node
    assert set(actor.driver.state.cordons) == {node}


def test_a_policy_without_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="attempts"):
        RetryPolicy(attempts=0)
