"""The scheduler's calls to Ray's Jobs API, made in order on a thread of their own.

The Jobs API (launch a granted workload, stop a preempted job) is served by the dashboard, one
process that a large cluster can overload, and `JobSubmissionClient` sets no timeout on its
requests: a hung dashboard holds the thread that called it until it answers. Through the
outbox it holds only these calls, in the order the scheduler decided them (a job's launch
before its stop), never a scheduling decision or a caller of the actor.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

log = logging.getLogger(__name__)


class JobsApiOutbox:
    SLOW_S = 5.0  # a call that waited or ran this long is logged: the dashboard is slow

    def __init__(self, thread_name: str = "scheduler-jobs-api") -> None:
        # One worker: the calls keep their order, and a hung dashboard holds one thread.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name)
        self._lock = threading.Lock()
        self._backlog = 0

    @property
    def backlog(self) -> int:
        """Calls queued or under way (`switchyard status` shows it when not 0)."""
        with self._lock:
            return self._backlog

    def put(self, what: str, call: Callable[[], None]) -> None:
        """Make `call` after every call put before it. `what` names it in the log: no
        arguments, since a launch's runtime env may hold secrets."""
        with self._lock:
            self._backlog += 1
        self._executor.submit(self._make, what, call, time.monotonic())

    def _make(self, what: str, call: Callable[[], None], queued_at: float) -> None:
        started = time.monotonic()
        try:
            call()
        except Exception:  # the Jobs API raises several types: logged, and the next call is made
            log.exception("scheduler: %s failed", what)
        finally:
            with self._lock:
                self._backlog -= 1
        done = time.monotonic()
        if done - queued_at >= self.SLOW_S:
            log.warning(
                "scheduler: %s took %.1f s, after %.1f s behind earlier Jobs API calls (is the dashboard overloaded?)",
                what,
                done - started,
                started - queued_at,
            )
