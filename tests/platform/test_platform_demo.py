"""`switchyard demo` (the README's first command) runs the whole story on a fresh local
cluster and reports it as one JSON object; every fact in it was read back from the platform."""

from __future__ import annotations

import json

import pytest

from tests.platform.test_platform_up_down import switchyard

pytestmark = [pytest.mark.ray, pytest.mark.own_cluster]


def test_demo_runs_the_story_and_cleans_up() -> None:
    report = json.loads(switchyard("demo", "--json", timeout=900).stdout)
    steps = [s["step"] for s in report["steps"]]
    assert steps == [
        "policy_check", "up", "train_started", "gateway_chat", "budget_refusal", "burst", "resumed", "status", "down"
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
