"""The preemption channel on a Ray cluster: notices in the GCS key-value store.

Any process connected to the cluster (an operator's CLI, a drain hook, the job's own driver on
SIGTERM) posts with `send_notice`; the scheduler posts the notice it keeps, lease id and all,
with `post`. Rank 0 of the job reads it. The GCS outlives workers and drivers, so a notice sent
before a worker starts is still seen.
"""

from __future__ import annotations

from ray.experimental import internal_kv

from switchyard.scheduler.preemption_channel import PreemptionNotice, check_job_id

NAMESPACE = "switchyard"
KEY_PREFIX = "train/preempt/"


def notice_key(job_id: str) -> bytes:
    return f"{KEY_PREFIX}{check_job_id(job_id)}".encode()


def _require_ray() -> None:
    if not internal_kv._internal_kv_initialized():
        raise RuntimeError("GcsPreemptionChannel needs a connected Ray (call ray.init first)")


class GcsPreemptionChannel:
    """`PreemptionChannel` over `ray.experimental.internal_kv` (one key per job id)."""

    def send_notice(self, job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice:
        notice = PreemptionNotice(job_id, reason, deadline)
        self.post(notice)
        return notice

    def post(self, notice: PreemptionNotice) -> None:
        _require_ray()
        key = notice_key(notice.job_id)
        internal_kv._internal_kv_put(key, notice.to_json().encode(), overwrite=True, namespace=NAMESPACE)

    def poll(self, job_id: str) -> PreemptionNotice | None:
        _require_ray()
        raw = internal_kv._internal_kv_get(notice_key(job_id), namespace=NAMESPACE)
        return None if raw is None else PreemptionNotice.from_json(raw)

    def clear(self, job_id: str) -> None:
        _require_ray()
        internal_kv._internal_kv_del(notice_key(job_id), namespace=NAMESPACE)


def send_notice(job_id: str, reason: str, deadline: float | None = None) -> PreemptionNotice:
    """What the scheduler calls: ask Ray Train job `job_id` to checkpoint and stop."""
    return GcsPreemptionChannel().send_notice(job_id, reason, deadline)
