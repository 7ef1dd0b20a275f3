"""`switchyard report` as a user runs it: a separate process, on a state directory with no
platform up (the GPU section says so), refused to keys that may not operate."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from switchyard.cli._auth import ensure_admin_key
from switchyard.db.schemas import migrate_stores
from switchyard.policy.keys import KeyStore
from switchyard.policy.models import Role

REPO = Path(__file__).resolve().parents[2]


def report(state: Path, out: Path, key: str) -> subprocess.CompletedProcess[str]:
    args = ["--state-dir", str(state), "--out", str(out), "--since", "7d", "--api-key", key]
    return subprocess.run(
        [sys.executable, "-m", "switchyard.cli", "report", *args, "--policies", str(REPO / "policies"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "RAY_ADDRESS": ""},
        cwd=REPO,
    )


def test_the_report_is_one_offline_page_for_operators(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    migrate_stores(state)
    admin = ensure_admin_key(state)
    assert admin is not None
    with KeyStore.in_state_dir(state) as keys:
        member, _ = keys.create("demo", Role.MEMBER)
    out = tmp_path / "report.html"
    made = report(state, out, admin)
    assert made.returncode == 0, made.stderr
    figures = json.loads(made.stdout)
    assert figures["out"] == str(out) and figures["traffic"] == {} and figures["gpus"] == {"scheduler": False}
    html = out.read_text()
    assert "no requests" in html and "The scheduler was not reachable" in html
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "")  # loads nothing from the network
    refused = report(state, tmp_path / "no.html", member)
    assert refused.returncode == 3 and "may not operate the platform" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "no.html").exists()


def test_the_policy_state_reads_past_lines_that_are_no_change(tmp_path: Path) -> None:
    """Found reading the operator view (stop 44): a line of the change journal that was JSON of
    another shape, or not UTF-8, raised out of the page (AttributeError, UnicodeDecodeError)
    instead of being skipped as a torn line is."""
    from types import SimpleNamespace

    from switchyard.console.views import _policy_state

    applied = {"at": 1.0, "applied": True, "fingerprint": "abc", "commit": None, "error": None}
    rejected = {"at": 2.0, "applied": False, "fingerprint": "", "commit": None, "error": "org.yaml: bad"}
    lines = [json.dumps(applied).encode(), b"[1, 2]", b"\xff\xfe not text", json.dumps(rejected).encode(), b'{"at": 3']
    (tmp_path / "policy_changes.jsonl").write_bytes(b"\n".join(lines))
    state = _policy_state(SimpleNamespace(state=tmp_path))  # type: ignore[arg-type]
    assert state["last_applied"]["fingerprint"] == "abc" and state["last_rejected"]["error"] == "org.yaml: bad"
