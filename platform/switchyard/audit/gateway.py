"""The factories the gateway app calls to get this package's collaborators.

`serve_apps/gateway.py` looks up `gateway_audit_sink(policy_store, state_dir)` and
`gateway_redactor(policy_store, state_dir)` here. `gateway_audit_parts` builds both around one
Presidio scrubber, so the sink reuses the redactor's analysis of the input (a few ms per
request) and can report its backlog (`on_backlog`, e.g. `SpoolBacklogGauge(replica).set`).
A replica names its spool after its charge journal (`writer`) and passes the ledger's view
(`ledger`), so a dead replica's streams are recorded at the cost the ledger charged them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fastapi import APIRouter

from switchyard.audit.analysis_pool import AnalysisProcessPool
from switchyard.audit.builder import RecordBuilder
from switchyard.audit.http import audit_router
from switchyard.audit.query import AuditReader
from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.spool import AuditSpool, LedgerView
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.policy.keys import Principal
from switchyard.policy.store import PolicySource


def gateway_audit_sink(
    policy_store: PolicySource,
    state_dir: str | Path,
    scrubber: TextScrubber | None = None,
    on_backlog: Callable[[int], None] | None = None,
    writer: str | None = None,
    ledger: LedgerView | None = None,
) -> StoreAuditSink:
    """The durable/spooled sink: the audit store and keyring of `state_dir` (SQLite files under
    `<state_dir>/audit/`, or the shared database), the spool under `<state_dir>/audit/spool`.
    Spools that a killed replica left behind are drained by `await sink.recover()`, which the
    replica calls before it takes traffic, after its budget gate's `recover()`."""
    store = AuditStore.in_state_dir(Path(state_dir))
    spool_dir = Path(state_dir) / "audit" / "spool"
    keyring = SubjectKeyring.in_state_dir(Path(state_dir))
    builder = RecordBuilder(lambda: policy_store.current.data, scrubber or TextScrubber(), keyring)
    spool = AuditSpool(spool_dir, store, on_backlog=on_backlog, writer_id=writer, ledger=ledger)
    return StoreAuditSink(builder, store, spool)


def gateway_redactor(
    policy_store: PolicySource, state_dir: str | Path, scrubber: TextScrubber | None = None
) -> PresidioRedactor:
    return PresidioRedactor(lambda: policy_store.current.data, scrubber or TextScrubber())


def gateway_audit_parts(
    policy_store: PolicySource,
    state_dir: str | Path,
    on_backlog: Callable[[int], None] | None = None,
    writer: str | None = None,
    ledger: LedgerView | None = None,
) -> tuple[StoreAuditSink, PresidioRedactor]:
    # Large texts are analysed in a worker process, off the replica's event loop and GIL.
    scrubber = TextScrubber(offload=AnalysisProcessPool())
    return (
        gateway_audit_sink(policy_store, state_dir, scrubber, on_backlog, writer, ledger),
        gateway_redactor(policy_store, state_dir, scrubber),
    )


def gateway_audit_router(
    policy_store: PolicySource, state_dir: str | Path, verify_key: Callable[[str], Principal | None]
) -> APIRouter:
    """The audit admin endpoint over the same store and keyring the gateway's sink writes."""
    store = AuditStore.in_state_dir(Path(state_dir))
    reader = AuditReader(store, SubjectKeyring.in_state_dir(Path(state_dir)), lambda: policy_store.current.data)
    return audit_router(reader, store, verify_key)
