"""The web console in a real browser (Debian's Chromium, driven by Playwright) against a running
platform: keys of each role sign in, open their views, and every figure checked on a page is
recomputed here from the platform's databases (the audit log, the ledger, the scheduler's event
log), from the run's metrics file, or from `switchyard status`, never from the console's code.

`scripts/chromium.sh` installs the browser (as `scripts/test.sh` does before the suite); without
it these checks fail, they do not skip.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any

CHROMIUM = Path("/usr/bin/chromium")
# Chromium's own connections would be refused one by one on a closed network (the machines
# this runs on reach no Google host); nothing here needs them.
CHROMIUM_ARGS = [
    "--no-sandbox",  # the suite runs as root in a container
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DEMO_TEAM, TRAIN_TEAM = "demo", "research"


@contextmanager
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    assert CHROMIUM.is_file(), f"{CHROMIUM} is missing: run scripts/chromium.sh (scripts/test.sh does)"
    with sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield chromium
        finally:
            chromium.close()


class Console:
    """One browser context (its own cookies) signed in with one key."""

    def __init__(self, chromium: Any, base: str, shots: Path | None) -> None:
        self.context = chromium.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.base = base.rstrip("/")
        self.shots = shots

    def sign_in(self, key: str) -> None:
        self.page.goto(f"{self.base}/login")
        self.page.fill("#api-key", key)
        self.page.click("#sign-in")
        self.page.wait_for_url(f"{self.base}/")
        assert key not in self.page.url

    def open(self, path: str, shot: str | None = None) -> int:
        response = self.page.goto(f"{self.base}{path}")
        assert response is not None
        if shot and self.shots is not None:
            self.screenshot(self.shots / f"{shot}.png")
        return int(response.status)

    def screenshot(self, path: Path) -> None:
        """The viewport (docs show the top). Chromium now and then refuses one capture ("Unable to
        capture screenshot", a CDP error, not a timeout) and takes the same picture when asked
        again: that is the browser's hiccup, not the console's, so it is asked once more."""
        from playwright.sync_api import Error

        try:
            self.page.screenshot(path=str(path))
        except Error as refused:
            if "Unable to capture screenshot" not in refused.message:
                raise
            time.sleep(0.25)
            self.page.screenshot(path=str(path))

    def figure(self, selector: str) -> str:
        return str(self.page.locator(selector).first.inner_text()).strip()

    def figures(self, selector: str, attribute: str) -> list[str]:
        return [
            str(v)
            for v in self.page.locator(selector).evaluate_all(f"els => els.map(e => e.getAttribute('{attribute}'))")
        ]

    def api(self, path: str) -> tuple[int, Any]:
        """A data endpoint, fetched with this browser context's cookies."""
        response = self.context.request.get(f"{self.base}/api{path}")
        return int(response.status), response.json()

    def cookies(self) -> list[dict[str, Any]]:
        return list(self.context.cookies())

    def close(self) -> None:
        self.context.close()


# ------------------------------------------------------------------------- independent figures


def audit_counts(state: Path, team: str) -> dict[str, int]:
    """Requests, errors, fallbacks and sheds of a team, straight from the audit database."""
    counts = {"requests": 0, "errors": 0, "fallbacks": 0, "sheds": 0}
    with closing(sqlite3.connect(state / "audit" / "audit.db")) as db:
        for (payload,) in db.execute("SELECT payload FROM entries WHERE kind = 'request' AND team = ?", (team,)):
            r = json.loads(payload)
            counts["requests"] += 1
            counts["errors"] += r["status_code"] >= 400
            counts["fallbacks"] += len({(a["provider"], a["model"]) for a in r["attempts"]}) > 1
            counts["sheds"] += r["error_code"] == "overloaded"
    return counts


def audit_entries(state: Path, kind: str) -> int:
    with closing(sqlite3.connect(state / "audit" / "audit.db")) as db:
        (n,) = db.execute("SELECT COUNT(*) FROM entries WHERE kind = ?", (kind,)).fetchone()
    return int(n)


def ledger_month(state: Path, team: str, month: str) -> tuple[float, dict[str, float]]:
    """A team's charges this month from the ledger database: total USD and USD per flow."""
    by_flow: dict[str, int] = {}
    with closing(sqlite3.connect(state / "ledger.db")) as db:
        rows = db.execute("SELECT flow, nanos FROM charges WHERE team = ? AND day >= ?", (team, f"{month}-01"))
        for flow, nanos in rows:
            by_flow[flow] = by_flow.get(flow, 0) + int(nanos)
    return sum(by_flow.values()) / 1e9, {f: n / 1e9 for f, n in by_flow.items()}


def scheduler_events(state: Path, workload_id: str, kind: str) -> int:
    with closing(sqlite3.connect(state / "scheduler.db")) as db:
        (n,) = db.execute(
            "SELECT COUNT(*) FROM events WHERE workload_id = ? AND kind = ?", (workload_id, kind)
        ).fetchone()
    return int(n)


def team_events(state: Path, team: str, kind: str) -> int:
    with closing(sqlite3.connect(state / "scheduler.db")) as db:
        (n,) = db.execute("SELECT COUNT(*) FROM events WHERE team = ? AND kind = ?", (team, kind)).fetchone()
    return int(n)


def checkpointed_since_resume(state: Path, workload_id: str, job: str) -> bool:
    """Whether the run has written a checkpoint since it last resumed (a new worker group sets
    Ray Train's checkpoint-time gauges at its first checkpoint, not at its start)."""
    with closing(sqlite3.connect(state / "scheduler.db")) as db:
        row = db.execute(
            "SELECT details FROM events WHERE workload_id = ? AND kind = 'resumed' ORDER BY seq DESC LIMIT 1",
            (workload_id,),
        ).fetchone()
    resumed_at = int(json.loads(row[0])["step"]) if row else -1
    run_dir = state / "train" / "checkpoints" / TRAIN_TEAM / job  # a platform job's run is under its team's
    steps = [int(p.name.removeprefix("step-")) for p in run_dir.glob("step-*")]
    return any(step > resumed_at for step in steps)


def metrics_losses(state: Path, job: str) -> dict[float, float]:
    """The run's loss per step from its metrics file (the last line written for a step wins)."""
    out: dict[float, float] = {}
    path = state / "train" / "checkpoints" / TRAIN_TEAM / job / "metrics.jsonl"
    for raw in path.read_text().splitlines():
        if raw.strip():
            line = json.loads(raw)
            out[float(line["step"])] = float(line["loss"])
    return out


def leased_split(status: dict[str, Any]) -> dict[str, float]:
    """Serve and train GPUs from `switchyard status --json`'s scheduler leases."""
    leases = status["scheduler"]["leases"]
    serve = sum(float(x["gpus"]) for x in leases if str(x["lease_id"]).startswith("serve:"))
    train = sum(float(x["gpus"]) for x in leases if not str(x["lease_id"]).startswith("serve:"))
    return {"serve": serve, "train": train}


def gateway_status(gateway: str, key: str) -> dict[str, Any]:
    """The gateway's own status (policy, circuits), as `switchyard status` reads it."""
    import httpx

    answer = httpx.get(f"{gateway}/v1/switchyard/status", headers={"Authorization": f"Bearer {key}"}, timeout=10)
    answer.raise_for_status()
    return dict(answer.json())


def has_gpu() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def stable(read: Callable[[], Any], check: Callable[[Any], Any], tries: int = 4) -> None:
    """Run `check(value)` between two equal reads of a live value (a training job may finish
    between a page load and the read that checks it). A check that fails while the value
    changed under it (CI: the page drew step 340, written after the read before it) is tried
    again; one that fails on a value that stayed the same fails the test."""
    failed: AssertionError | None = None
    for _ in range(tries):
        before = read()
        try:
            check(before)
        except AssertionError as exc:
            if read() == before:
                raise
            failed = exc
        else:
            if read() == before:
                return
            failed = None
        time.sleep(2)
    raise AssertionError("the platform's state kept changing across every check") from failed
