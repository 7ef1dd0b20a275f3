"""Who may read what: the role-checked query, the HTTP admin router and the CLI."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from _audit_helpers import make_exchange, make_flow
from fastapi import FastAPI
from fastapi.testclient import TestClient

from switchyard.audit.builder import RecordBuilder
from switchyard.audit.http import audit_router
from switchyard.audit.query import AuditQuery, AuditReader, parse_since
from switchyard.audit.redaction import TextScrubber
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring
from switchyard.cli import main
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore, Principal
from switchyard.policy.models import DataPolicies, Role
from switchyard.policy.roles import Forbidden

SUPPORT_ADMIN = Principal("sa", "support", Role.TEAM_ADMIN)
AUDITOR = Principal("au", PLATFORM_TEAM, Role.AUDITOR)


@pytest.fixture
def state(tmp_path: Path, data_policies: DataPolicies, scrubber: TextScrubber) -> Path:
    """A state dir with records of two teams: support (personal, internal) and payments."""
    store = AuditStore.in_state_dir(tmp_path)
    builder = RecordBuilder(data_policies, scrubber, SubjectKeyring.in_state_dir(tmp_path))
    store.append(
        [
            builder.build(make_exchange(request_id="sup-personal")),
            builder.build(
                make_exchange(flow=make_flow(flow="triage", data_class="internal"), request_id="sup-internal")
            ),
            builder.build(
                make_exchange(
                    flow=make_flow(team="payments", flow="dispute-review", data_class="confidential"),
                    request_id="pay-1",
                )
            ),
        ]
    )
    store.close()
    return tmp_path


def _reader(state: Path, data_policies: DataPolicies) -> AuditReader:
    return AuditReader(AuditStore.in_state_dir(state), SubjectKeyring.in_state_dir(state), data_policies)


def test_team_admin_reads_only_its_team(state: Path, data_policies: DataPolicies) -> None:
    reader = _reader(state, data_policies)
    assert {v["request_id"] for v in reader.query(SUPPORT_ADMIN, AuditQuery("support"))} == {
        "sup-personal",
        "sup-internal",
    }
    with pytest.raises(Forbidden):
        reader.query(SUPPORT_ADMIN, AuditQuery("payments"))
    with pytest.raises(Forbidden):
        reader.query(SUPPORT_ADMIN, AuditQuery(None))
    with pytest.raises(Forbidden):
        reader.query(Principal("m", "support", Role.MEMBER), AuditQuery("support"))
    assert len(reader.query(AUDITOR, AuditQuery(None))) == 3


def test_bodies_follow_the_class_readers_and_reading_is_audited(state: Path, data_policies: DataPolicies) -> None:
    reader = _reader(state, data_policies)
    views = {v["request_id"]: v for v in reader.query(SUPPORT_ADMIN, AuditQuery("support", with_bodies=True))}
    assert "bodies" not in views["sup-personal"]  # personal: auditors and platform admins only
    assert "jane.doe@example.com" in views["sup-internal"]["bodies"]["input"]  # internal: full text
    access = [v for v in reader.query(AUDITOR, AuditQuery(None)) if v["kind"] == "access"]
    assert len(access) == 1 and access[0]["reader_key_id"] == "sa" and access[0]["bodies_of"] == ["sup-internal"]
    # Metadata-only reads leave no access record.
    reader.query(SUPPORT_ADMIN, AuditQuery("support"))
    assert len([v for v in reader.query(AUDITOR, AuditQuery(None)) if v["kind"] == "access"]) == 1


def test_parse_since() -> None:
    assert parse_since("24h", now=100_000.0) == 100_000.0 - 86_400
    assert parse_since("1700000000") == 1_700_000_000.0
    assert parse_since("2026-11-30T00:00:00") == parse_since("2026-11-30T00:00:00+00:00")
    with pytest.raises(ValueError, match="since: expected unix seconds"):
        parse_since("yesterday")


def _keys(state: Path) -> dict[str, str]:
    ks = KeyStore.in_state_dir(state)
    return {
        "support-admin": ks.create("support", Role.TEAM_ADMIN)[0],
        "auditor": ks.create(PLATFORM_TEAM, Role.AUDITOR)[0],
        "platform-admin": ks.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)[0],
    }


def test_http_router(state: Path, data_policies: DataPolicies) -> None:
    keys = _keys(state)
    store = AuditStore.in_state_dir(state)
    app = FastAPI()
    app.include_router(
        audit_router(_reader(state, data_policies), store, KeyStore.in_state_dir(state).verifier().verify)
    )
    client = TestClient(app)
    assert client.get("/admin/audit/records", params={"team": "support"}).status_code == 401
    auth = {"Authorization": f"Bearer {keys['support-admin']}"}
    ok = client.get("/admin/audit/records", params={"team": "support", "since": "1d"}, headers=auth)
    assert ok.status_code == 200 and ok.json()["count"] == 2
    assert client.get("/admin/audit/records", params={"team": "payments"}, headers=auth).status_code == 403
    assert (
        client.get("/admin/audit/records", params={"team": "support", "since": "soon"}, headers=auth).status_code == 400
    )
    assert client.get("/admin/audit/verify", headers=auth).status_code == 403
    verified = client.get("/admin/audit/verify", headers={"Authorization": f"Bearer {keys['auditor']}"})
    assert verified.json()["ok"] is True and verified.json()["entries"] == 3


def _cli(capsys: pytest.CaptureFixture[str], state: Path, key: str, *argv: str) -> tuple[int, str]:
    code = main(["audit", *argv, "--state-dir", str(state), "--api-key", key])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_cli_query_verify_erase(state: Path, capsys: pytest.CaptureFixture[str]) -> None:
    keys = _keys(state)
    code, out = _cli(capsys, state, keys["support-admin"], "query", "--team", "support", "--json")
    assert code == 0 and {r["request_id"] for r in json.loads(out)} == {"sup-personal", "sup-internal"}
    code, out = _cli(capsys, state, keys["support-admin"], "query", "--team", "payments")
    assert code == 3 and "may not read audit records for team 'payments'" in out
    code, out = _cli(capsys, state, keys["auditor"], "query", "--flow", "reply")
    assert code == 0 and "reversible EMAIL_ADDRESS:1" in out and "triage" not in out

    code, out = _cli(capsys, state, keys["auditor"], "verify")
    assert code == 0 and out.startswith("ok: 3 entries")
    with sqlite3.connect(state / "audit" / "audit.db") as db:
        db.execute(
            "UPDATE entries SET payload = replace(payload, '\"status_code\":200', '\"status_code\":500') WHERE seq = 2"
        )
    code, out = _cli(capsys, state, keys["auditor"], "verify")
    assert code == 1 and "seq 2: edited" in out

    code, out = _cli(capsys, state, keys["support-admin"], "erase", "--team", "support", "--subject", "u-42")
    assert code == 3
    code, out = _cli(capsys, state, keys["platform-admin"], "erase", "--team", "support", "--subject", "u-42")
    assert code == 0 and "erased subject 'support/u-42'" in out
