"""The audit spool's backlog as a Ray metric (`switchyard_audit_spool_backlog`).

Labels are the gateway replica only: never a team, user or request value,
so no request content can reach the metrics system through a label.
"""

from __future__ import annotations

from ray.util.metrics import Gauge

BACKLOG_METRIC = "switchyard_audit_spool_backlog"


class SpoolBacklogGauge:
    """Pass `gauge.set` as `AuditSpool(on_backlog=...)`; Ray exports it with the node's metrics."""

    def __init__(self, replica: str) -> None:
        self.tags = {"replica": replica}
        self._gauge = Gauge(
            BACKLOG_METRIC,
            description="Audit records acknowledged to callers but not yet committed to the store.",
            tag_keys=("replica",),
        )

    def set(self, backlog: int) -> None:
        self._gauge.set(float(backlog), tags=self.tags)
