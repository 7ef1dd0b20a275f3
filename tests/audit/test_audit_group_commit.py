"""Durable (high-risk) appends of concurrent requests share transactions, and none returns
before a transaction holding its record has committed; a failed commit fails every record of
its batch closed (503, kept in the spool), as a failed append of one record did."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

import pytest
from _audit_helpers import make_exchange, make_flow

from switchyard.audit.builder import PendingEntry, RecordBuilder
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.sink import StoreAuditSink
from switchyard.audit.spool import AuditSpool
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.gateway.seams import AuditUnavailable
from switchyard.policy.models import DataPolicies, RiskTier

HIGH = make_flow(team="qa", flow="plain", data_class="internal", risk=RiskTier.HIGH)


class CommitLog:
    """Wraps the real `AuditStore.append`: which request ids each committed transaction held."""

    def __init__(self, store: AuditStore, delay_s: float = 0.0) -> None:
        self.real = store.append
        self.delay_s = delay_s
        self.batches: list[list[str]] = []
        self.committed: set[str] = set()

    def append(self, items: Sequence[PendingEntry]) -> int:
        time.sleep(self.delay_s)  # a slow disk: requests pile up behind the commit in flight
        added = self.real(items)
        ids = [i.record.request_id for i in items]
        self.batches.append(ids)
        self.committed.update(ids)
        return added


@pytest.fixture
def builder(tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> RecordBuilder:
    return RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path))


async def test_concurrent_durable_records_share_commits_and_each_waits_for_its_own(
    tmp_path: Path, builder: RecordBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    log = CommitLog(store, delay_s=0.02)
    monkeypatch.setattr(store, "append", log.append)
    sink = StoreAuditSink(builder, store, None)
    early: list[str] = []

    async def one() -> None:
        exchange = make_exchange(flow=HIGH, text="ok", output="fine")
        await sink.record(exchange, durable=True)
        if exchange.ctx.request_id not in log.committed:
            early.append(exchange.ctx.request_id)

    await one()  # alone: it commits at once (no timer waits for company)
    assert [len(b) for b in log.batches] == [1]
    await asyncio.gather(*(one() for _ in range(40)))
    assert early == []  # no record() returned before its transaction committed
    assert store.count() == 41 and sum(len(b) for b in log.batches) == 41
    assert len(log.batches) < 10, [len(b) for b in log.batches]  # shared: not one commit each
    assert store.verify() == []  # one hash chain, unbroken across the batches


async def test_a_failed_commit_fails_its_whole_batch_closed_and_spools_each_record(
    tmp_path: Path, builder: RecordBuilder, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AuditStore.in_state_dir(tmp_path)
    spool = AuditSpool(tmp_path / "spool", store, drain_interval_s=3600)
    await spool.start()
    sink = StoreAuditSink(builder, store, spool)
    real = store.append

    def full_disk(items: Sequence[PendingEntry]) -> int:
        time.sleep(0.02)
        raise sqlite3.OperationalError("database or disk is full")

    monkeypatch.setattr(store, "append", full_disk)
    results = await asyncio.gather(
        *(sink.record(make_exchange(flow=HIGH), durable=True) for _ in range(8)), return_exceptions=True
    )
    assert all(isinstance(r, AuditUnavailable) for r in results), results
    assert spool.backlog == 8  # each withheld answer's record is kept for the store's return
    monkeypatch.setattr(store, "append", real)
    await sink.record(make_exchange(flow=HIGH), durable=True)  # the store is back: commits again
    assert store.count() == 1
    await sink.close()  # drains the spooled eight
    assert AuditStore.in_state_dir(tmp_path).count() == 9
