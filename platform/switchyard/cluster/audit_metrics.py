"""The audit spool's backlog as a Ray metric (`switchyard_audit_spool_backlog`).

Labels are the gateway replica only: never a team, user or request value,
so no request content can reach the metrics system through a label. The backlog changes on
every spooled record; only its latest value is recorded, once a second (`MetricBatch`).
"""

from __future__ import annotations

from ray.util.metrics import Gauge

from switchyard.cluster.metric_batching import MetricBatch

BACKLOG_METRIC = "switchyard_audit_spool_backlog"


class SpoolBacklogGauge:
    """Pass `gauge.set` as `AuditSpool(on_backlog=...)`; Ray exports it with the node's metrics."""

    def __init__(self, replica: str, batch: MetricBatch | None = None) -> None:
        self.tags = {"replica": replica}
        self._batch = batch or MetricBatch()
        self._tag_items = tuple(self.tags.items())
        self._gauge = Gauge(
            BACKLOG_METRIC,
            description="Audit records acknowledged to callers but not yet committed to the store.",
            tag_keys=("replica",),
        )

    def set(self, backlog: int) -> None:
        self._batch.set(self._gauge, float(backlog), self._tag_items)
