"""The one typed client of the live scheduler actor (`scheduler_actor`): `SchedulerService` over Ray.

Every call goes through a `SchedulerTransport` (the seam: `RayActorTransport` in a cluster, a
fake in unit tests). A call that finds the actor dead or restarting is retried with backoff,
within a deadline; a mutation keeps the same request id on every try, so a retry after the
actor restarted is answered from its log, not done twice:

- `submit` and `cancel` carry a fresh request id (uuid4) that the driver remembers;
- `claim` is idempotent by its arguments (the same job claiming the same lease gets the grant
  again), `release` by its lease id (the driver remembers each answer);
- `report_checkpoint` and `report_resume` carry one too (a retried report neither moves the
  checkpoint time again nor writes the event row twice), even when sent without waiting;
- `cordon`, `uncordon` and `drain` carry one (a retried drain reports the node as it is then,
  sending no notice twice); reads are safe to repeat.

A call the actor refused (a bad request: it raised) is not retried; its error reaches the caller.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from switchyard.scheduler.api import LeaseGrant, WorkloadSubmission
from switchyard.scheduler.driver.node_cordons import DrainReport
from switchyard.scheduler.preemption_channel import PreemptionNotice


class SchedulerUnavailable(RuntimeError):
    """The actor could not answer (dead, restarting, unreachable); the call may be retried."""


class SchedulerTransport(Protocol):
    def call(self, method: str, args: tuple[Any, ...], timeout_s: float | None) -> Any:
        """Call the actor's `method` and wait for its answer. Raises `SchedulerUnavailable`
        when the actor could not answer, what the actor raised when it refused the call."""
        ...

    def send(self, method: str, args: tuple[Any, ...]) -> None:
        """Call without waiting for the answer (advisory reports)."""
        ...


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 20
    """Tries per call, the first included."""
    first_backoff_s: float = 0.05
    """Wait after the first failed try; doubled after each, up to `max_backoff_s`."""
    max_backoff_s: float = 1.0
    deadline_s: float = 60.0
    """No try starts after this long since the call began (a restart takes seconds, not this)."""
    call_timeout_s: float | None = None
    """Wait for one answer (None: as long as it takes, like `ray.get`); a try that times out
    raises `ray.exceptions.GetTimeoutError` and is not retried (its call may still run)."""

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"RetryPolicy.attempts must be at least 1, got {self.attempts}")


class RayActorTransport:
    """The actor behind a Ray actor handle. A dead or restarting actor is `SchedulerUnavailable`;
    a detached actor with `max_restarts` comes back under the same handle."""

    def __init__(self, handle: Any) -> None:
        self._handle = handle

    def call(self, method: str, args: tuple[Any, ...], timeout_s: float | None) -> Any:
        import ray
        from ray.exceptions import RayActorError  # ActorDiedError, ActorUnavailableError and their base

        try:
            return ray.get(getattr(self._handle, method).remote(*args), timeout=timeout_s)
        except RayActorError as exc:
            raise SchedulerUnavailable(f"scheduler actor: {type(exc).__name__} in {method}") from exc

    def send(self, method: str, args: tuple[Any, ...]) -> None:
        getattr(self._handle, method).remote(*args)


class SchedulerClient:
    """`SchedulerService`, and the rest of the actor's interface, as typed methods."""

    def __init__(
        self,
        transport: SchedulerTransport,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._transport = transport
        self._retry = retry or RetryPolicy()
        self._sleep = sleep
        self._clock = clock

    @classmethod
    def of_handle(cls, handle: Any, retry: RetryPolicy | None = None) -> SchedulerClient:
        return cls(RayActorTransport(handle), retry)

    # ------------------------------------------------------------------ mutations
    def submit(self, submission: WorkloadSubmission) -> str:
        answer: str = self._call("submit", submission, _request_id())
        return answer

    def cancel(self, workload_id: str) -> None:
        self._call("cancel", workload_id, _request_id())

    def claim(self, workload_id: str, ray_job_id: str, lease_id: str | None = None) -> LeaseGrant | None:
        grant: LeaseGrant | None = self._call("claim", workload_id, ray_job_id, lease_id)
        return grant

    def release(self, lease_id: str, finished: bool = True) -> bool:
        """True: the workload was requeued (it will be admitted again)."""
        requeued: bool = self._call("release", lease_id, finished)
        return requeued

    def report_checkpoint(self, workload_id: str, wait: bool = True) -> None:
        """`wait=False`: sent, not waited for (a job's checkpoint hook must not block on it)."""
        args = (workload_id, _request_id())
        if wait:
            self._call("report_checkpoint", *args)
        else:
            self._transport.send("report_checkpoint", args)

    def report_resume(self, workload_id: str, step: int, checkpoint: str, wait: bool = True) -> None:
        args = (workload_id, step, checkpoint, _request_id())
        if wait:
            self._call("report_resume", *args)
        else:
            self._transport.send("report_resume", args)

    # ------------------------------------------------------------------ operators' node commands
    def cordon(self, node: str) -> str:
        """No new lease on `node` (an id or a prefix of one); returns the node id."""
        found: str = self._call("cordon", node, _request_id())
        return found

    def uncordon(self, node: str) -> str:
        found: str = self._call("uncordon", node, _request_id())
        return found

    def drain(self, node: str, force: bool = False) -> DrainReport:
        """Cordon `node` and notice the leases there that may move (`force`: non-preemptible
        ones too); the report names what blocks the drain."""
        report: DrainReport = self._call("drain", node, force, _request_id())
        return report

    # ------------------------------------------------------------------ reads
    def lease(self, workload_id: str) -> LeaseGrant | None:
        grant: LeaseGrant | None = self._call("lease", workload_id)
        return grant

    def preemption_notice(self, workload_id: str) -> PreemptionNotice | None:
        notice: PreemptionNotice | None = self._call("preemption_notice", workload_id)
        return notice

    def list_workloads(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("list_workloads")
        return rows

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self._call("events", workload_id)
        return rows

    def nodes(self) -> list[dict[str, Any]]:
        """Each node's cordon state and what runs there (`views.node_rows`)."""
        rows: list[dict[str, Any]] = self._call("nodes")
        return rows

    def status(self) -> dict[str, Any]:
        found: dict[str, Any] = self._call("status")
        return found

    def ping(self) -> float:
        """When the actor's current incarnation started (changes when Ray restarts it)."""
        started: float = self._call("ping")
        return started

    def pid(self) -> int:
        """The actor's process id (the benchmark and tests kill it)."""
        found: int = self._call("pid")
        return found

    # ------------------------------------------------------------------ retries
    def _call(self, method: str, *args: Any) -> Any:
        """`method(*args)`, retried while the actor is unavailable: the same args (and so the
        same request id) on every try."""
        policy = self._retry
        started = self._clock()
        backoff = policy.first_backoff_s
        for attempt in range(1, policy.attempts + 1):
            try:
                return self._transport.call(method, args, policy.call_timeout_s)
            except SchedulerUnavailable:
                elapsed = self._clock() - started
                if attempt == policy.attempts or elapsed + backoff > policy.deadline_s:
                    raise
            self._sleep(backoff)
            backoff = min(backoff * 2, policy.max_backoff_s)
        raise AssertionError("unreachable: the last attempt returns or raises")


def platform_scheduler(retry: RetryPolicy | None = None) -> SchedulerClient:
    """The platform's scheduler (the named actor `deploy.start_scheduler` starts) on the Ray
    cluster this process is connected to. Raises ValueError when that cluster runs none."""
    import ray

    from switchyard.cluster.record import NAMESPACE, SCHEDULER_ACTOR

    return SchedulerClient.of_handle(ray.get_actor(SCHEDULER_ACTOR, namespace=NAMESPACE), retry)


def _request_id() -> str:
    return uuid.uuid4().hex
