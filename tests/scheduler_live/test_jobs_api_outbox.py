"""The scheduler's Jobs API outbox: calls in the order put, none waited on by the caller (no Ray)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from switchyard.cluster.jobs_api_outbox import JobsApiOutbox


def test_calls_are_made_in_order_and_a_hung_one_holds_only_those_behind_it(caplog: pytest.LogCaptureFixture) -> None:
    outbox = JobsApiOutbox("test-outbox")
    answer = threading.Event()
    made: list[str] = []

    def hung() -> None:  # a dashboard that does not answer
        answer.wait(30)
        made.append("launch")

    def failing() -> None:
        made.append("stop")
        raise ConnectionError("dashboard gone")

    started = time.monotonic()
    outbox.put("LaunchJob", hung)
    outbox.put("StopLaunchedJob", failing)
    outbox.put("LaunchJob", lambda: made.append("next launch"))
    assert time.monotonic() - started < 1.0  # the caller did not wait
    assert outbox.backlog == 3 and made == []
    answer.set()
    deadline = time.monotonic() + 10
    while outbox.backlog and time.monotonic() < deadline:
        time.sleep(0.01)
    assert made == ["launch", "stop", "next launch"]  # a failed call does not stop the rest
    assert outbox.backlog == 0
    assert any("StopLaunchedJob failed" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
