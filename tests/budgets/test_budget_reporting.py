"""`switchyard budgets` and `GET /admin/spend`: spend by team, flow, model and day; a team
admin sees only its team; a member sees nothing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fastapi import FastAPI, Request
from fastapi.testclient import TestClient

from switchyard.budgets.http import spend_router
from switchyard.budgets.ledger import BudgetLedger, Charge, HoldRequest
from switchyard.budgets.resolve import BudgetLine
from switchyard.cli import main
from switchyard.db.engine import Database
from switchyard.db.location import Store, open_store
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore, Principal
from switchyard.policy.models import Role


def seed(db: Database) -> BudgetLedger:
    ledger = BudgetLedger(db)
    lines = {
        "support": (
            BudgetLine("org:acme:day:2026-11-30", 10**12, "2026-12-01T00:00:00+00:00"),
            BudgetLine("team:support:day:2026-11-30", 10**11, "2026-12-01T00:00:00+00:00"),
        ),
        "payments": (
            BudgetLine("org:acme:day:2026-11-30", 10**12, "2026-12-01T00:00:00+00:00"),
            BudgetLine("team:payments:day:2026-11-30", 10**11, "2026-12-01T00:00:00+00:00"),
        ),
    }
    for team, flow, model, nanos in (
        ("support", "reply", "gpt-4o-mini", 2_000_000),
        ("support", "triage", "gpt-4o-mini", 1_000_000),
        ("payments", "dispute-review", "claude-sonnet", 5_000_000),
    ):
        hid = f"{team}-{flow}"
        ledger.hold(HoldRequest(hid, "r", lines[team], nanos, nanos, 60))
        ledger.settle(hid, [Charge(hid, team, flow, model, None, "2026-11-30", nanos, 100, 50)], close=True)
    return ledger


@pytest.fixture
def state(budget_state: Path) -> tuple[Path, dict[str, str]]:
    with KeyStore.in_state_dir(budget_state) as store:
        keys = {
            "admin": store.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)[0],
            "support-admin": store.create("support", Role.TEAM_ADMIN)[0],
            "support-member": store.create("support", Role.MEMBER)[0],
        }
    seed(open_store(budget_state, Store.LEDGER)).db.close()  # where the CLI will look for it
    return budget_state, keys


def cli(state: Path, key: str, *args: str) -> tuple[int, str]:
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["budgets", "--state-dir", str(state), "--api-key", key, *args])
    return code, out.getvalue()


def test_cli_platform_admin_sees_every_team(state: tuple[Path, dict[str, str]]) -> None:
    path, keys = state
    code, out = cli(path, keys["admin"], "--json")
    assert code == 0
    report = json.loads(out)
    assert {r["team"] for r in report["spend"]} == {"support", "payments"}
    assert report["total_usd"] == pytest.approx(0.008)
    assert "org:acme:day:2026-11-30" in {b["budget"] for b in report["budgets"]}


def test_cli_team_admin_sees_only_its_team(
    state: tuple[Path, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    path, keys = state
    code, out = cli(path, keys["support-admin"], "--json")
    assert code == 0
    report = json.loads(out)
    assert report["team"] == "support"
    assert [(r["flow"], r["usd"]) for r in report["spend"]] == [("reply", 0.002), ("triage", 0.001)]
    assert [b["budget"] for b in report["budgets"]] == ["team:support:day:2026-11-30"]
    code, _ = cli(path, keys["support-admin"], "--team", "payments")
    assert code == 3
    assert "may not read spend for team 'payments'" in capsys.readouterr().err


def test_cli_member_may_not_read_spend_and_table_output(state: tuple[Path, dict[str, str]]) -> None:
    path, keys = state
    assert cli(path, keys["support-member"], "--team", "support")[0] == 3
    code, out = cli(path, keys["admin"], "--team", "support")
    assert code == 0
    assert "team:support:day:2026-11-30" in out and "total: $0.0030" in out


def test_http_spend_endpoint_scopes_by_role(ledger_db: Database) -> None:
    ledger = seed(ledger_db)
    principals = {
        "admin": Principal("k0", PLATFORM_TEAM, Role.PLATFORM_ADMIN),
        "support-admin": Principal("k1", "support", Role.TEAM_ADMIN),
        "member": Principal("k2", "support", Role.MEMBER),
    }

    def authenticate(request: Request) -> Principal:
        return principals[request.headers["x-who"]]

    app = FastAPI()
    app.include_router(spend_router(lambda: ledger, authenticate))
    client = TestClient(app)
    everyone = client.get("/admin/spend", headers={"x-who": "admin"})
    assert everyone.status_code == 200 and everyone.json()["total_usd"] == pytest.approx(0.008)
    own = client.get("/admin/spend", headers={"x-who": "support-admin"})
    assert own.status_code == 200 and {r["team"] for r in own.json()["spend"]} == {"support"}
    assert client.get("/admin/spend?team=payments", headers={"x-who": "support-admin"}).status_code == 403
    assert client.get("/admin/spend", headers={"x-who": "member"}).status_code == 403
    assert client.get("/admin/spend?since=yesterday", headers={"x-who": "admin"}).status_code == 400
    later = client.get("/admin/spend?since=2026-12-01", headers={"x-who": "admin"}).json()
    assert later["spend"] == []
