"""The scripted end-to-end story behind `switchyard demo` (and `make demo`).

It runs against a fresh local platform in its own state directory, exercises each part that
exists — policies, keys, the gateway over HTTP with the real OpenAI SDK, the scheduler's gang
admission — prints each step as it happens, and tears everything down unless `keep` is set.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from switchyard.paths import policies_dir


@dataclass
class DemoReport:
    steps: list[dict[str, Any]] = field(default_factory=list)
    summary: dict[str, Any] = field(default_factory=dict)

    def step(self, name: str, **facts: Any) -> None:
        self.steps.append({"step": name, **facts})


def _switchyard(*args: str) -> dict[str, Any]:
    """Run a CLI command as a user would, and parse its --json output."""
    proc = subprocess.run(
        [sys.executable, "-m", "switchyard.cli", *args, "--json"], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`switchyard {' '.join(args)}` failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    parsed: dict[str, Any] = json.loads(proc.stdout)
    return parsed


def run_demo(keep: bool = False, say: Callable[[str], None] = print, state: Path | None = None) -> DemoReport:
    report = DemoReport()
    state = state or Path(tempfile.mkdtemp(prefix="switchyard-demo-"))
    policies = policies_dir()
    check = _switchyard("policy", "check", str(policies))
    say(f"1. policies: {check['teams']} teams, {check['flows']} flows, fingerprint {check['fingerprint'][:12]}")
    report.step("policy_check", **check)

    started = time.monotonic()
    up = _switchyard("up", "--demo", "--detach", "--state-dir", str(state))
    say(
        f"2. platform up in {time.monotonic() - started:.0f}s: gateway {up['gateway_url']}, "
        f"dashboard {up['dashboard_url']}"
    )
    report.step("up", gateway_url=up["gateway_url"], dashboard_url=up["dashboard_url"])
    try:
        _exercise(up, state, report, say)
    finally:
        if keep:
            say(f"--keep: still running; stop it with `switchyard down --state-dir {state}`")
        else:
            _switchyard("down", "--state-dir", str(state))
            say("6. platform down")
            report.step("down")
    return report


def _exercise(up: dict[str, Any], state: Path, report: DemoReport, say: Callable[[str], None]) -> None:
    from switchyard.demo_steps import call_gateway, scheduler_gang_admission

    chat = call_gateway(up["gateway_url"], up["demo_api_key"])
    say(
        f"3. gateway chat as team 'demo': HTTP {chat['status']} from {chat.get('provider')}/{chat.get('model')}: "
        f"{chat['summary']} (an untrained seeded model until a training job leaves a checkpoint)"
    )
    report.step("gateway_chat", **chat)
    report.summary["gateway"] = {"requests": 1, "status": chat["status"]}

    gang = scheduler_gang_admission(up["ray_address"])
    say(
        f"4. scheduler: an 8-GPU STRICT_PACK gang for team {gang['team']!r} was "
        f"{'granted on node group ' + gang['node_group'] if gang['granted'] else 'not granted'} "
        f"after {gang['wait_s']:.1f}s; released"
    )
    report.step("scheduler_gang", **gang)

    status = _switchyard("status", "--state-dir", str(state))
    g = status["gpus"]
    say(
        f"5. status: {g['total']:.0f} GPUs = {g['serve']:.0f} serve + {g['train']:.0f} train + {g['free']:.0f} free; "
        f"serve apps: {', '.join(status['serve'])}"
    )
    report.step("status", gpus=g, serve_apps=sorted(status["serve"]))
    report.summary["status"] = {"gpus": g, "serve_apps": sorted(status["serve"])}
