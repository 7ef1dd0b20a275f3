"""`switchyard demo` (the README's first command) runs the whole story on a fresh local
cluster and reports it as one JSON object; every fact in it was read back from the platform.

The platform the demo leaves (`--keep`) is then looked at as people look at it: the web console
in a real browser, with a key of each role (`test_the_console_shows_each_role_its_figures`), and
the Grafana dashboards' queries through a real Prometheus scraping it. `switchyard down` ends it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.platform import console_browser as cb
from tests.platform.test_platform_up_down import switchyard

pytestmark = [pytest.mark.ray, pytest.mark.own_cluster]


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Any], Path]]:
    state = tmp_path_factory.mktemp("demo") / "state"
    try:
        ran = switchyard("demo", "--json", "--keep", "--state-dir", str(state), check=False, timeout=900)
        assert ran.returncode == 0, f"switchyard demo -> {ran.returncode}\n{ran.stderr[-3000:]}"
        yield json.loads(ran.stdout), state
    finally:  # --keep leaves the platform up even when the story failed half-way
        if (state / "up.json").exists():
            down = switchyard("down", "--state-dir", str(state), check=False, timeout=300)
            assert down.returncode == 0, down.stderr
            assert not (state / "up.json").exists()


def test_demo_runs_the_story(demo: tuple[dict[str, Any], Path]) -> None:
    report, _ = demo
    steps = [s["step"] for s in report["steps"]]
    assert steps == [
        "policy_check",
        "up",
        "train_started",
        "gateway_chat",
        "budget_refusal",
        "burst",
        "resumed",
        "status",
    ]
    chat = next(s for s in report["steps"] if s["step"] == "gateway_chat")
    assert chat["status"] == 200 and chat["provider"] == "local" and "@step-" in chat["model"]

    train, serve, gateway = report["train"], report["serve"], report["gateway"]
    assert train["preempted"] is True and train["resumed_from_step"] > 0
    assert 2 <= serve["max_replicas"] <= serve["replica_bound"]
    assert gateway["requests"] > 0 and "fallbacks" in gateway
    assert report["budget"]["refused_status"] == 402 and report["budget"]["code"] == "over_budget"
    # One audit record per request the demo made, and the chain verifies.
    assert report["audit"]["records"] == gateway["requests"] and report["audit"]["chain_ok"] is True

    # The preemption was the scheduler's doing: pending replica -> reclaim -> notice -> the job
    # checkpointed and released -> the replica got the GPU and ran -> the job resumed.
    kinds = [link["kind"] for link in report["cause_chain"]]
    assert kinds[:3] == ["replica_pending", "reclaim_decision", "preemption_notice"]
    # The job saw the notice, checkpointed and released its GPUs itself (no stop at the grace
    # deadline); the replica then got the freed GPU.
    assert kinds[3] == "requeued" and kinds[-2:] == ["replica_running", "resumed"]
    assert kinds[4] in ("admitted", "adopted")
    assert report["cause_chain"][2]["workload_id"] == train["workload_id"]
    assert report["status"]["gpus"]["total"] == 8


def test_every_grafana_panel_has_series_after_traffic(demo: tuple[dict[str, Any], Path]) -> None:
    """Each dashboard panel's query, run by a real Prometheus (Debian's) scraping the platform
    after the demo's traffic plus a streamed request and a few too-tight deadlines (they time
    out and open the local provider's circuit)."""
    import httpx

    from tests.platform.prometheus_check import check_dashboards_against

    report, state = demo
    gateway = next(s for s in report["steps"] if s["step"] == "up")["gateway_url"]
    key = _key(state, cb.DEMO_TEAM, "member")
    admin_key = (state / "admin.key").read_text().strip()
    chat = {"model": "auto", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 8}
    with httpx.Client(base_url=f"{gateway}/v1", headers={"Authorization": f"Bearer {key}"}, timeout=60) as client:
        deadline = time.monotonic() + 30
        while (answer := client.post("/chat/completions", json=chat)).status_code == 401:
            assert time.monotonic() < deadline, "the gateway never took the new key"
            time.sleep(1)  # replicas poll the key store: a new key is known within their refresh
        assert answer.status_code == 200, answer.text
        with client.stream("POST", "/chat/completions", json={**chat, "stream": True}) as streamed:
            assert streamed.status_code == 200 and "data:" in streamed.read().decode()
        # Deadlines too tight for the model until the local circuit opens (then a request skips
        # it). Too tight and the gateway itself uses the deadline up before any attempt (it did
        # at 30 ms under CI's load); too loose and the model answers. Where that band lies moves
        # with the machine's load, so each answer steers the next deadline into it. The breaker
        # opens at half its calls failing, and at one deadline the outcome is noisy (CI saw 200s
        # and timeouts alternate at 22-33 ms, 22 timeouts to 35 answers, and no opening), so
        # the steering holds the deadline at the edge where about half the requests start no
        # attempt: an attempt that does start there has little time left and mostly times out.
        # They ask for the flow's whole 64 tokens: at 8, the model answered in a few ms, so the
        # band between "no attempt" and "answered" was that narrow, and CI once saw 80 requests
        # at 17-30 ms answer or start nothing (8 timeouts) with the circuit still closed.
        tight = {**chat, "max_tokens": 64}
        deadline_ms, tries, outcomes = 30.0, 0, []
        while cb.gateway_status(gateway, admin_key)["circuits"]["local"]["times_opened"] == 0:
            assert tries < 80, f"80 requests with too-tight deadlines never opened the local circuit: {outcomes}"
            tries += 1
            answer = client.post(
                "/chat/completions",
                json=tight,
                headers={"x-switchyard-flow": "assist", "x-switchyard-deadline-ms": str(round(deadline_ms))},
            )
            outcomes.append((round(deadline_ms), answer.status_code, answer.text[-80:]))
            if answer.status_code == 200:  # in time: tighter
                deadline_ms = max(5.0, deadline_ms * 0.85)
            elif "tried: nothing" in answer.text:  # no attempt started: a little looser
                deadline_ms = min(2000.0, deadline_ms * 1.08)
            else:  # timed out, as wanted: a little tighter still, towards that edge
                deadline_ms = max(5.0, deadline_ms * 0.97)
        client.post("/chat/completions", json=chat, headers={"x-switchyard-flow": "assist"})  # skips it
    workload = report["train"]["workload_id"]
    deadline = time.monotonic() + 180
    while not cb.checkpointed_since_resume(state, workload, "demo-fsdp"):
        assert time.monotonic() < deadline, "the resumed training job wrote no checkpoint in 180 s"
        time.sleep(2)
    time.sleep(10)  # Ray exports what the replicas counted once per metrics report interval (10 s)
    ray_temp_dir = json.loads((state / "up.json").read_text())["ray_temp_dir"]
    allow_empty: set[str] = set()
    if not cb.has_gpu():
        allow_empty.add("switchyard-training: MFU")  # no peak FLOP/s is known for a CPU: no MFU to export
    # Fallbacks and sheds need the local model's Serve queue past its bound (the demo's burst
    # is sized to scale replicas, not to overflow them): their panels may be empty only when
    # the audit log shows that none happened.
    happened = cb.audit_counts(state, cb.DEMO_TEAM)
    if happened["fallbacks"] == 0:
        allow_empty.add("switchyard-gateway: Fallbacks taken")
    if happened["sheds"] == 0:
        allow_empty.add("switchyard-gateway: Shed requests (503 overloaded)")
    print(f"dashboard panels allowed to be empty: {sorted(allow_empty)}")
    counts = check_dashboards_against(Path(ray_temp_dir), timeout_s=120, allow_empty=allow_empty)
    assert sum(1 for n in counts.values() if n > 0) >= len(counts) - len(allow_empty)


def _key(state: Path, team: str, role: str) -> str:
    made = json.loads(
        switchyard("keys", "create", "--team", team, "--role", role, "--json", "--state-dir", str(state)).stdout
    )
    return str(made["key"])


def test_the_console_shows_each_role_its_figures(demo: tuple[dict[str, Any], Path], tmp_path: Path) -> None:
    report, state = demo
    up = next(s for s in report["steps"] if s["step"] == "up")
    base, gateway = up["console_url"], up["gateway_url"]
    shots = Path(os.environ.get("SWITCHYARD_CONSOLE_SCREENSHOTS", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    keys = {
        "team-admin": _key(state, cb.DEMO_TEAM, "team-admin"),
        "researcher": _key(state, cb.TRAIN_TEAM, "member"),
        "auditor": _key(state, "platform", "auditor"),
        "platform-admin": (state / "admin.key").read_text().strip(),
    }
    workload = report["train"]["workload_id"]
    month = datetime.now(UTC).strftime("%Y-%m")
    started = time.monotonic()
    with cb.browser() as chromium:
        # A team admin: its team's traffic and spend, as the audit log and the ledger hold them.
        admin = cb.Console(chromium, base, shots)
        admin.sign_in(keys["team-admin"])
        [session] = [c for c in admin.cookies() if c["name"] == "sy_console_session"]
        assert session["httpOnly"] and session["sameSite"] == "Strict" and session["path"] == "/console"
        assert admin.open(f"/teams/{cb.DEMO_TEAM}", shot="team-overview") == 200
        counts = cb.audit_counts(state, cb.DEMO_TEAM)
        assert counts["requests"] > 0 and counts["errors"] >= 1  # the budget refusal is an error
        shown = {k: int(admin.figure(f"#traffic-totals [data-figure={k}]")) for k in counts}
        assert shown == counts
        plotted = admin.figures("figure[data-chart] [data-series=requests][data-y]", "data-y")
        assert sum(float(y) for y in plotted) == counts["requests"]  # every request is in one bucket

        def circuit() -> str:  # the earlier test's too-tight deadlines may have opened it
            return str(cb.gateway_status(gateway, keys["platform-admin"])["circuits"]["local"]["state"])

        def check_circuit(state_now: str) -> None:
            admin.open(f"/teams/{cb.DEMO_TEAM}")
            assert admin.figure("#circuits [data-provider=local] [data-figure=state]") == state_now

        cb.stable(circuit, check_circuit)
        assert admin.open(f"/teams/{cb.DEMO_TEAM}/spend", shot="team-spend") == 200
        total, by_flow = cb.ledger_month(state, cb.DEMO_TEAM, month)
        assert float(admin.figures("#total-usd", "data-value")[0]) == pytest.approx(total, abs=1e-9)
        shown_flows = dict(
            zip(
                admin.figures("#by-flow tr[data-flow]", "data-flow"),
                admin.figures("#by-flow [data-value]", "data-value"),
                strict=True,
            )
        )
        assert {f: float(v) for f, v in shown_flows.items()} == pytest.approx(by_flow, abs=1e-9)
        assert admin.open(f"/teams/{cb.TRAIN_TEAM}") == 403  # another team's page
        assert admin.api(f"/teams/{cb.TRAIN_TEAM}/spend")[0] == 403  # and its data

        # A researcher (a member of the training team): the job, its preemption, its loss curve.
        researcher = cb.Console(chromium, base, shots)
        researcher.sign_in(keys["researcher"])
        assert researcher.open(f"/teams/{cb.TRAIN_TEAM}/jobs", shot="researcher-jobs") == 200
        row = f"#jobs tr[data-workload='{workload}']"
        assert (
            int(researcher.figure(f"{row} [data-figure=preemptions]"))
            == cb.scheduler_events(state, workload, "preemption_notice")
            >= 1
        )
        assert (
            int(researcher.figure(f"{row} [data-figure=resumes]"))
            == cb.scheduler_events(state, workload, "resumed")
            >= 1
        )
        job_name = researcher.api(f"/teams/{cb.TRAIN_TEAM}/jobs/{workload}")[1]["job"]["description"]

        def check_curve(losses: dict[float, float]) -> None:
            assert researcher.open(f"/teams/{cb.TRAIN_TEAM}/jobs/{workload}", shot="researcher-run") == 200
            xs = researcher.figures("[data-series=loss][data-x]", "data-x")
            ys = researcher.figures("[data-series=loss][data-y]", "data-y")
            assert losses and dict(zip(map(float, xs), map(float, ys), strict=True)) == losses

        cb.stable(lambda: cb.metrics_losses(state, job_name), check_curve)
        assert researcher.open(f"/teams/{cb.TRAIN_TEAM}/spend") == 403  # a member reads no money
        assert researcher.open(f"/teams/{cb.DEMO_TEAM}/jobs") == 403
        assert researcher.open("/operator") == 403 and researcher.api("/operator")[0] == 403

        # An operator: the GPU split now, as the scheduler's leases say, and the reclaim's causes.
        operator = cb.Console(chromium, base, shots)
        operator.sign_in(keys["platform-admin"])

        def operator_split() -> dict[str, float]:
            return cb.leased_split(json.loads(switchyard("status", "--json", "--state-dir", str(state)).stdout))

        def check_split(split: dict[str, float]) -> None:
            assert operator.open("/operator", shot="operator") == 200
            shown = {k: float(operator.figure(f"[data-figure={k}]")) for k in ("serve", "train")}
            assert shown == split
            last = {
                s: float(operator.figures(f"figure[data-chart] [data-series={s}][data-y]", "data-y")[-1])
                for s in ("serve", "train")
            }
            assert last == split  # the chart ends at the split now

        cb.stable(operator_split, check_split)
        kinds = operator.figures(".cause-chain li", "data-kind")
        assert kinds[:3] == ["reclaim_decision", "preemption_notice", "requeued"], kinds
        research = "#teams tr[data-team=research]"
        notices = cb.team_events(state, cb.TRAIN_TEAM, "preemption_notice")
        assert int(operator.figure(f"{research} [data-figure=preemptions]")) == notices >= 1

        # An auditor: chain verification, and a read of bodies that is itself audited.
        auditor = cb.Console(chromium, base, shots)
        auditor.sign_in(keys["auditor"])
        accesses = cb.audit_entries(state, "access")
        assert auditor.open("/audit", shot="auditor") == 200
        chain = auditor.page.locator("#chain")
        assert chain.get_attribute("data-ok") == "true"
        assert auditor.open(f"/audit?team={cb.DEMO_TEAM}&since=1d&bodies=1") == 200
        assert cb.audit_entries(state, "access") == accesses + 1  # the body view was audited
        assert auditor.open("/operator") == 403

        # Signing out ends the session; so does revoking the key.
        operator.page.click("#sign-out")
        assert operator.open("/operator") == 200 and operator.page.url.endswith("/console/login")
        admin_id = json.loads(switchyard("keys", "list", "--json", "--state-dir", str(state)).stdout)
        [record] = [k for k in admin_id if k["team"] == cb.DEMO_TEAM and k["role"] == "team-admin"]
        switchyard("keys", "revoke", record["key_id"], "--state-dir", str(state))
        admin.open(f"/teams/{cb.DEMO_TEAM}")
        assert admin.page.url.endswith("/console/login")
    print(f"console browser checks: {time.monotonic() - started:.1f}s; screenshots in {shots}")
