"""The console's sign-in, sessions and role checks, over real stores in a state directory (keys,
ledger, audit) and the real app; only the scheduler is an in-memory stand-in (no Ray here).

Every route is tried with every role, for the key's own team and another, on the page and its
JSON twin: the expected answers are written out below, not derived from the code under test.
"""

from __future__ import annotations

import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from switchyard.console.app import ROUTES, SESSION_COOKIE, create_console
from switchyard.console.sessions import SessionStore
from switchyard.console.sources import PlatformReader
from switchyard.db.schemas import migrate_stores
from switchyard.policy.keys import PLATFORM_TEAM, KeyStore
from switchyard.policy.models import Role
from tests.skewed_host import on_a_skewed_host

REPO = Path(__file__).resolve().parents[2]
OWN, OTHER = "demo", "search"
JOB = "wl-own"


class FakeScheduler:
    """What the scheduler actor answers, for a team with one training job."""

    def status(self) -> dict[str, Any]:
        return {"total_gpus": 8, "teams": [], "waits": {}, "fairness": {}, "pools": [], "pending": []}

    def events(self, workload_id: str | None = None) -> list[dict[str, Any]]:
        return [{"seq": 1, "at": 1.0, "kind": "submitted", "workload_id": JOB, "team": OWN, "gpus": 2}]

    def list_workloads(self) -> list[dict[str, Any]]:
        return [{"workload_id": JOB, "team": OWN, "gpus": 2, "state": "queued", "description": "own-job", "attempt": 0}]

    def nodes(self) -> list[dict[str, Any]]:
        return []


@pytest.fixture
def platform(tmp_path: Path) -> Any:
    state = tmp_path / "state"
    state.mkdir()
    policies = tmp_path / "policies"
    shutil.copytree(REPO / "policies", policies)
    migrate_stores(state)
    keys = KeyStore.in_state_dir(state)
    reader = PlatformReader(state, policies, FakeScheduler, gateway_url=None)
    sessions = SessionStore(keys)
    app = create_console(reader, sessions)
    made = {
        role: keys.create(PLATFORM_TEAM if role in (Role.AUDITOR, Role.PLATFORM_ADMIN) else OWN, role) for role in Role
    }
    yield app, keys, {role: key for role, (key, _) in made.items()}, {role: rec for role, (_, rec) in made.items()}
    reader.close()
    keys.close()


def client(app: Any) -> TestClient:
    # As Serve calls it: the full path, with the route prefix as root_path.
    return TestClient(app, base_url="http://127.0.0.1/console", root_path="/console", follow_redirects=False)


def sign_in(c: TestClient, key: str) -> Any:
    form = c.get("/login")
    csrf = re.search(r'name="csrf" value="([^"]+)"', form.text)
    assert csrf is not None
    return c.post("/login", content=f"csrf={csrf[1]}&api_key={key}", headers={"content-type": _FORM})


_FORM = "application/x-www-form-urlencoded"

# Route name -> the roles that may open it for their own team / for another team.
OPEN_FOR_OWN = {
    "team": {Role.MEMBER, Role.TEAM_ADMIN},
    "spend": {Role.TEAM_ADMIN},
    "jobs": {Role.MEMBER, Role.TEAM_ADMIN},
    "job": {Role.MEMBER, Role.TEAM_ADMIN},
    "team_audit": {Role.TEAM_ADMIN},
}
EVERY_TEAM = {Role.AUDITOR: {"team", "spend", "jobs", "job", "team_audit", "auditor"}, Role.PLATFORM_ADMIN: "all"}


def expected(role: Role, route: str, team: str) -> int:
    wide = EVERY_TEAM.get(role)
    if wide == "all" or (wide is not None and route in wide):
        return 200
    if team == OWN and route in OPEN_FOR_OWN and role in OPEN_FOR_OWN[route]:
        return 200
    return 403


def path_of(route: str, team: str) -> str:
    [r] = [r for r in ROUTES if r.name == route]
    return r.path.replace("{team}", team).replace("{workload_id}", JOB)


@pytest.mark.parametrize("role", list(Role))
def test_every_route_answers_each_role_as_the_admin_api_would(platform: Any, role: Role) -> None:
    app, _, keys, _ = platform
    c = client(app)
    assert sign_in(c, keys[role]).status_code == 303
    for route in ROUTES:
        for team in (OWN, OTHER):
            want = expected(role, route.name, team)
            if want == 200 and route.name == "job" and team == OTHER:
                want = 404  # allowed to look, but the job is the other team's
            path = path_of(route.name, team)
            page, data = c.get(path), c.get(f"/api{path}")
            assert (page.status_code, data.status_code) == (want, want), (role, path, page.text[:300])
            if want == 403:
                assert "may not" in data.json()["error"] and OTHER not in data.json()["error"]


def test_nothing_is_served_without_a_session(platform: Any) -> None:
    app, _, _, _ = platform
    c = client(app)
    for route in ROUTES:
        path = path_of(route.name, OWN)
        page = c.get(path)
        assert page.status_code == 303 and page.headers["location"] == "/console/login"
        assert c.get(f"/api{path}").status_code == 401
    assert c.get("/").headers["location"] == "/console/login"


def test_the_session_cookie_is_httponly_strict_and_scoped_to_the_console(platform: Any) -> None:
    app, _, keys, _ = platform
    c = client(app)
    signed = sign_in(c, keys[Role.MEMBER])
    cookie = signed.headers["set-cookie"]
    assert cookie.startswith(f"{SESSION_COOKIE}=")
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Path=/console" in cookie
    assert keys[Role.MEMBER] not in cookie  # the cookie is a session token, never the key
    assert signed.headers["cache-control"] == "no-store"
    assert "default-src 'none'" in signed.headers["content-security-policy"]


def test_sign_in_refuses_a_form_without_its_csrf_cookie_or_token(platform: Any) -> None:
    app, _, keys, _ = platform
    key = keys[Role.MEMBER]
    c = client(app)
    # A cross-site form post: SameSite=Strict keeps the sign-in cookie home, so none arrives.
    forged = c.post("/login", content=f"csrf=guess&api_key={key}", headers={"content-type": _FORM})
    assert forged.status_code == 403 and SESSION_COOKIE not in forged.headers.get("set-cookie", "")
    c.get("/login")  # a real form's cookie, but another token
    wrong = c.post("/login", content=f"csrf=guess&api_key={key}", headers={"content-type": _FORM})
    assert wrong.status_code == 403
    assert sign_in(c, "sy_nosuch_key").status_code == 401
    too_big = c.post("/login", content="csrf=" + "x" * 5000, headers={"content-type": _FORM})
    assert too_big.status_code == 413


def test_sign_out_needs_the_pages_token_and_ends_the_session(platform: Any) -> None:
    app, _, keys, _ = platform
    c = client(app)
    sign_in(c, keys[Role.TEAM_ADMIN])
    home = c.get("/")
    assert home.status_code == 200 and f"team {OWN}" in home.text
    token = re.search(r'name="csrf" value="([^"]+)"', home.text)
    assert token is not None
    assert c.post("/logout", content="csrf=forged", headers={"content-type": _FORM}).status_code == 403
    assert c.get(f"/teams/{OWN}").status_code == 200  # a forged sign-out ended nothing
    cookie = c.cookies.get(SESSION_COOKIE)
    out = c.post("/logout", content=f"csrf={token[1]}", headers={"content-type": _FORM})
    assert out.status_code == 303 and out.headers["location"] == "/console/login"
    c.cookies.set(SESSION_COOKIE, cookie or "")  # the old cookie, replayed
    assert c.get(f"/teams/{OWN}").status_code == 303


def test_revoking_the_key_ends_its_sessions(platform: Any) -> None:
    app, store, keys, records = platform
    c = client(app)
    sign_in(c, keys[Role.TEAM_ADMIN])
    assert c.get(f"/api/teams/{OWN}/spend").status_code == 200
    store.revoke(records[Role.TEAM_ADMIN].key_id)
    assert c.get(f"/api/teams/{OWN}/spend").status_code == 401


def test_sessions_expire_and_store_no_token(tmp_path: Path) -> None:
    now = [1_000.0]
    with KeyStore.in_state_dir(tmp_path, clock=lambda: now[0]) as keys:
        key, _ = keys.create(OWN, Role.MEMBER)
        sessions = SessionStore(keys, ttl_s=60, clock=lambda: now[0])
        opened = sessions.open(key)
        assert opened is not None
        token, session = opened
        assert sessions.resolve(token) == session
        with keys.db.read() as tx:
            stored = tx.execute("SELECT token_hash FROM console_sessions").rows
        assert stored and token not in {r[0] for r in stored}
        now[0] += 61
        assert sessions.resolve(token) is None
        assert sessions.prune(older_than_s=0) == 1


# A console replica on another host (`on_a_skewed_host`): does the session token `argv[2]`
# sign it in?
_SIGNS_IN = """
import sys
from pathlib import Path
from switchyard.console.sessions import SessionStore
from switchyard.policy.keys import KeyStore
with KeyStore.in_state_dir(Path(sys.argv[1])) as keys:
    print(SessionStore(keys).resolve(sys.argv[2]) is not None)
"""


@pytest.mark.parametrize("skew_s", [-600.0, 600.0], ids=["10min-behind", "10min-ahead"])
def test_a_console_on_a_host_whose_clock_is_off_ends_sessions_on_time(tmp_path: Path, skew_s: float) -> None:
    """Stop 48: sessions and the keys they name expired by the clock of the console replica
    that looked. One 10 minutes ahead signed out a session opened a moment before (TTL 5
    minutes); one 10 minutes behind kept the session of a key already past its expiry."""
    with KeyStore.in_state_dir(tmp_path) as keys:
        fresh_key, _ = keys.create(OWN, Role.MEMBER)
        ending_key, _ = keys.create(OWN, Role.MEMBER, expires_at=time.time() + 1.0)
        sessions = SessionStore(keys, ttl_s=300)
        opened, ending = sessions.open(fresh_key), sessions.open(ending_key)
        assert opened is not None and ending is not None
    time.sleep(1.5)  # the second key has expired now; its session has not
    seen = [on_a_skewed_host(skew_s, _SIGNS_IN, str(tmp_path), token).strip() for token in (opened[0], ending[0])]
    assert seen == ["True", "False"]


def test_a_console_whose_clock_runs_ahead_gives_the_session_cookie_its_whole_ttl(tmp_path: Path) -> None:
    """Sessions expire by the database's clock since stop 48, so the cookie's max-age may not
    be their expiry less this host's clock: on a host 10 minutes ahead that came out at -300,
    and the browser dropped the cookie at once (signed in, then out)."""
    migrate_stores(tmp_path)
    with KeyStore.in_state_dir(tmp_path) as keys:
        key, _ = keys.create(OWN, Role.MEMBER)
        sessions = SessionStore(keys, ttl_s=300)
        reader = PlatformReader(tmp_path, REPO / "policies", FakeScheduler, gateway_url=None)
        c = client(create_console(reader, sessions, clock=lambda: time.time() + 600))
        answer = sign_in(c, key)
    assert answer.status_code == 303
    cookie = next(v for k, v in answer.headers.multi_items() if k == "set-cookie" and SESSION_COOKIE in v)
    assert "Max-Age=300" in cookie, cookie


def test_a_bad_since_is_a_clear_400(platform: Any) -> None:
    app, _, keys, _ = platform
    c = client(app)
    sign_in(c, keys[Role.PLATFORM_ADMIN])
    answer = c.get(f"/api/teams/{OWN}?since=yesterday")
    assert answer.status_code == 400 and "since" in answer.json()["error"]
    assert "yesterday" not in answer.text  # not echoed
    assert c.get("/api/teams/nosuchteam").status_code == 404


def test_a_scheduler_that_does_not_answer_is_said_not_a_500(tmp_path: Path) -> None:
    class Down(FakeScheduler):
        def status(self) -> dict[str, Any]:
            raise TimeoutError("the scheduler actor did not answer within 10 s")

    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    with KeyStore.in_state_dir(state) as keys:
        key, _ = keys.create(PLATFORM_TEAM, Role.PLATFORM_ADMIN)
        reader = PlatformReader(state, REPO / "policies", Down)
        try:
            c = client(create_console(reader, SessionStore(keys)))
            sign_in(c, key)
            for path in ("/operator", f"/teams/{OWN}/jobs"):
                page = c.get(path)
                assert page.status_code == 200 and "The scheduler is not reachable" in page.text
            assert c.get("/api/operator").json() == {"scheduler": False}
        finally:
            reader.close()


def test_a_page_links_only_to_what_the_key_may_open(platform: Any) -> None:
    app, _, keys, _ = platform
    links = {}
    for role in (Role.MEMBER, Role.TEAM_ADMIN):
        c = client(app)
        sign_in(c, keys[role])
        links[role] = set(re.findall(r'href="/console(/teams/demo[^"]*)"', c.get(f"/teams/{OWN}").text))
    assert links[Role.MEMBER] == {"/teams/demo", "/teams/demo/jobs"}
    assert links[Role.TEAM_ADMIN] == {"/teams/demo", "/teams/demo/jobs", "/teams/demo/spend", "/teams/demo/audit"}
