"""The factories the gateway app calls to get this package's collaborators.

`serve_apps/gateway.py` looks up `gateway_audit_sink(policy_store, state_dir)` and
`gateway_redactor(policy_store, state_dir)` here. `gateway_audit_parts` builds both around one
Presidio scrubber, so the sink reuses the redactor's analysis of the input (a few ms per
request) and can report its backlog (`on_backlog`, e.g. `SpoolBacklogGauge(replica).set`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter

from switchyard.audit.analysis_pool import AnalysisProcessPool
from switchyard.audit.builder import RecordBuilder
from switchyard.audit.http import audit_router
from switchyard.audit.query import AuditReader
from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.spool import AuditSpool, recover_orphans
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.policy.keys import Principal
from switchyard.policy.store import PolicySource

log = logging.getLogger(__name__)


def gateway_audit_sink(
    policy_store: PolicySource,
    state_dir: str | Path,
    scrubber: TextScrubber | None = None,
    on_backlog: Callable[[int], None] | None = None,
) -> StoreAuditSink:
    """The durable/spooled sink: the audit store and keyring of `state_dir` (SQLite files under
    `<state_dir>/audit/`, or the shared database), the spool under `<state_dir>/audit/spool`.
    Spools that a killed replica left behind are drained here, before the replica takes traffic."""
    store = AuditStore.in_state_dir(Path(state_dir))
    spool_dir = Path(state_dir) / "audit" / "spool"
    if spool_dir.is_dir():
        report = recover_orphans(spool_dir, store)
        if report.files:
            log.info("drained %d records left by dead gateway replicas", report.new_entries)
    keyring = SubjectKeyring.in_state_dir(Path(state_dir))
    builder = RecordBuilder(lambda: policy_store.current.data, scrubber or TextScrubber(), keyring)
    return StoreAuditSink(builder, store, AuditSpool(spool_dir, store, on_backlog=on_backlog))


def gateway_redactor(
    policy_store: PolicySource, state_dir: str | Path, scrubber: TextScrubber | None = None
) -> PresidioRedactor:
    return PresidioRedactor(lambda: policy_store.current.data, scrubber or TextScrubber())


def gateway_audit_parts(
    policy_store: PolicySource, state_dir: str | Path, on_backlog: Callable[[int], None] | None = None
) -> tuple[StoreAuditSink, PresidioRedactor]:
    # Large texts are analysed in a worker process, off the replica's event loop and GIL.
    scrubber = TextScrubber(offload=AnalysisProcessPool())
    return (
        gateway_audit_sink(policy_store, state_dir, scrubber, on_backlog),
        gateway_redactor(policy_store, state_dir, scrubber),
    )


def gateway_audit_router(
    policy_store: PolicySource, state_dir: str | Path, verify_key: Callable[[str], Principal | None]
) -> APIRouter:
    """The audit admin endpoint over the same store and keyring the gateway's sink writes."""
    store = AuditStore.in_state_dir(Path(state_dir))
    reader = AuditReader(store, SubjectKeyring.in_state_dir(Path(state_dir)), lambda: policy_store.current.data)
    return audit_router(reader, store, verify_key)
