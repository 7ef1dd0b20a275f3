"""`switchyard demo` (the README's first command) runs end to end on a fresh local cluster."""

from __future__ import annotations

import json

import pytest

from tests.platform.test_platform_up_down import switchyard

pytestmark = [pytest.mark.ray, pytest.mark.own_cluster]


def test_demo_runs_every_step_and_cleans_up() -> None:
    report = json.loads(switchyard("demo", "--json").stdout)
    steps = {s["step"]: s for s in report["steps"]}
    assert list(steps) == ["policy_check", "up", "gateway_chat", "scheduler_gang", "status", "down"]
    assert steps["policy_check"]["ok"] is True
    chat = steps["gateway_chat"]
    assert chat["status"] == 200 and chat["provider"] == "local"
    assert steps["scheduler_gang"]["granted"] is True and steps["scheduler_gang"]["node_group"] == "local"
    assert report["status"]["gpus"]["total"] == 8 and "gateway" in report["status"]["serve_apps"]
