"""A prompt with personal data under redacting classes: the raw values appear nowhere.

Not in the SQLite files (records, bodies, keys, WAL), the spool, the S3 objects, the
application logs, error bodies, or metric labels. (Ray's session logs are checked through the
gateway on Serve: tests/gateway/test_gw_serve.py::test_personal_data_reaches_no_ray_log.)
"""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import boto3
import pytest
from _audit_helpers import PERSONAL_TEXT, RAW_VALUES, make_exchange, make_flow
from fastapi import FastAPI
from fastapi.testclient import TestClient
from moto.server import ThreadedMotoServer

from switchyard.audit.export import S3Target, export_sealed
from switchyard.audit.http import audit_router
from switchyard.audit.query import AuditReader
from switchyard.audit.redaction import PresidioRedactor, TextScrubber
from switchyard.audit.sink import open_sink
from switchyard.cluster.audit_metrics import SpoolBacklogGauge
from switchyard.gateway.seams import AuditUnavailable, RedactionSummary
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore
from switchyard.policy.models import DataPolicies, RiskTier, Role


def _leaks(blob: bytes) -> list[str]:
    return [v for v in RAW_VALUES if v.encode() in blob]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_raw_personal_values_appear_nowhere(
    tmp_path: Path,
    data_policies: DataPolicies,
    scrubber: TextScrubber,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    caplog.set_level(logging.DEBUG)  # everything any library logs, Presidio included
    gauge_tags: list[dict[str, str]] = []
    gauge = SpoolBacklogGauge("replica-1")

    def on_backlog(n: int) -> None:
        gauge.set(n)
        gauge_tags.append(gauge.tags)

    sink = await open_sink(
        tmp_path,
        data_policies,
        scrubber,
        drain_interval_s=3600,
        on_backlog=on_backlog,
    )
    redactor = PresidioRedactor(data_policies, scrubber)
    errors: list[str] = []
    classes = (("personal", RiskTier.MEDIUM), ("regulated", RiskTier.HIGH), ("confidential", RiskTier.HIGH))
    for cls, risk in classes:
        flow = make_flow(data_class=cls, risk=risk)
        sent = redactor.redact([{"role": "user", "content": PERSONAL_TEXT}], cls)
        assert cls == "confidential" or not _leaks(str(sent.messages).encode())  # what the provider sees
        answer = redactor.restorer(sent).feed("Noted: <EMAIL_ADDRESS_1>") + redactor.restorer(sent).flush()
        exchange = make_exchange(
            flow=flow,
            output=answer + f" {RAW_VALUES[2]}",
            redaction=RedactionSummary(sent.summary.mode, sent.summary.entity_counts),
        )
        await sink.record(exchange, durable=risk is RiskTier.HIGH)
    # An error path: the store refuses a high-risk record; the error must not carry content.
    real_append = sink.store.append

    def refuse(*_: Any) -> int:
        import sqlite3

        raise sqlite3.OperationalError("disk I/O error")

    monkeypatch.setattr(sink.store, "append", refuse)
    with pytest.raises(AuditUnavailable) as failure:
        await sink.record(make_exchange(flow=make_flow(risk=RiskTier.HIGH)), durable=True)
    errors.append(str(failure.value))
    monkeypatch.setattr(sink.store, "append", real_append)
    spool_files = b"".join(p.read_bytes() for p in (tmp_path / "audit" / "spool").glob("*.spool"))
    assert spool_files and not _leaks(spool_files)
    await sink.close()

    # Reading bodies as an auditor, over HTTP, including error responses.
    keys = KeyStore.in_state_dir(tmp_path)
    auditor_key, _ = keys.create(PLATFORM_TEAM, Role.AUDITOR)
    from switchyard.audit.store import AuditStore

    store = AuditStore.in_state_dir(tmp_path)
    reader = AuditReader(store, sink.builder.keyring, data_policies)
    app = FastAPI()
    app.include_router(audit_router(reader, store, keys.verifier().verify))
    client = TestClient(app)
    bodies = client.get(
        "/admin/audit/records", params={"bodies": "true"}, headers={"Authorization": f"Bearer {auditor_key}"}
    )
    assert bodies.status_code == 200 and "<EMAIL_ADDRESS>" in bodies.text
    http_errors = [
        client.get(
            "/admin/audit/records",
            params={"team": "support", "since": PERSONAL_TEXT},
            headers={"Authorization": f"Bearer {auditor_key}"},
        ),
        client.get("/admin/audit/records", headers={"Authorization": f"Bearer {PERSONAL_TEXT}"}),
    ]
    assert [r.status_code for r in http_errors] == [400, 401]
    assert not _leaks(bodies.content)
    assert not _leaks(b"".join(r.content for r in http_errors))

    # S3 objects.
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        s3 = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}", region_name="us-east-1")
        s3.create_bucket(Bucket="audit", ObjectLockEnabledForBucket=True)
        store.seal_segments(size=100, include_partial=True)
        keys_written = export_sealed(store, s3, S3Target("audit"))
        objects = b"".join(s3.get_object(Bucket="audit", Key=k)["Body"].read() for k in keys_written)
    finally:
        server.stop()
    assert keys_written and not _leaks(objects)

    # Every file the audit system wrote (records, bodies, keys, WAL, spool), byte for byte.
    store.close()
    for path in (tmp_path / "audit").rglob("*"):
        if path.is_file():
            assert not _leaks(path.read_bytes()), f"raw personal data in {path}"
    assert not _leaks("\n".join(errors).encode())
    # The test's own HTTP client logs the URLs it requested (with the bad query): not ours.
    app_logs = "\n".join(r.getMessage() for r in caplog.records if not r.name.startswith("httpx"))
    assert "presidio" in " ".join(r.name for r in caplog.records)  # the capture did see libraries
    assert not _leaks(app_logs.encode()), "raw personal data in the logs"
    assert gauge_tags and all(t == {"replica": "replica-1"} for t in gauge_tags)
