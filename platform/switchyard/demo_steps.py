"""The demo's individual steps, each a real client of one part of the running platform."""

from __future__ import annotations

import os
import time
from typing import Any

import openai


def call_gateway(gateway_url: str, api_key: str) -> dict[str, Any]:
    """One chat completion through the gateway with the official OpenAI SDK, as a team would."""
    client = openai.OpenAI(base_url=f"{gateway_url}/v1", api_key=api_key, max_retries=0, timeout=120)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="auto",
            messages=[{"role": "user", "content": "Say hello to the platform."}],
            max_tokens=32,
            extra_headers={"X-Switchyard-Flow": "chat"},
        )
    except openai.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        error = body.get("error", body) if isinstance(body, dict) else {}
        return {"status": exc.status_code, "summary": f"{error.get('code')}: {error.get('message')}"}
    completion = raw.parse()
    text = completion.choices[0].message.content or ""
    return {
        "status": raw.http_response.status_code,
        "summary": repr(text[:60]),
        "provider": raw.headers.get("x-switchyard-provider"),
        "model": raw.headers.get("x-switchyard-model"),
    }


def scheduler_gang_admission(
    ray_address: str, team: str = "research", gpus: int = 8, timeout_s: float = 60.0
) -> dict[str, Any]:
    """Ask the live scheduler for an 8-GPU gang on one node group, wait for the grant, release it."""
    from switchyard.cluster.head import PLATFORM_ENV

    os.environ.update(PLATFORM_ENV)
    import ray

    from switchyard.cluster.record import NAMESPACE, SCHEDULER_ACTOR
    from switchyard.scheduler.api import WorkloadSubmission
    from switchyard.scheduler.core import PlacementStrategy

    ray.init(address=ray_address, namespace=NAMESPACE, logging_level="WARNING", log_to_driver=False)
    try:
        scheduler = ray.get_actor(SCHEDULER_ACTOR, namespace=NAMESPACE)
        teams = {t["team"] for t in ray.get(scheduler.status.remote())["teams"]}
        if team not in teams:
            raise RuntimeError(f"policies/scheduler.yaml has no team {team!r} (teams: {sorted(teams)})")
        submission = WorkloadSubmission(
            team=team,
            bundles=(gpus,),
            strategy=PlacementStrategy.STRICT_PACK,
            same_node_group=True,
            description="demo gang",
        )
        started = time.monotonic()
        ray.get(scheduler.submit.remote(submission))
        grant = None
        while grant is None and time.monotonic() - started < timeout_s:
            grant = ray.get(scheduler.lease.remote(submission.workload_id))
            time.sleep(0.2)
        waited = time.monotonic() - started
        if grant is None:
            ray.get(scheduler.cancel.remote(submission.workload_id))
            return {"team": team, "granted": False, "wait_s": waited, "node_group": None}
        ray.get(scheduler.release.remote(grant.lease_id, True))
        return {
            "team": team,
            "granted": True,
            "wait_s": waited,
            "node_group": grant.placements[0].node_group,
            "lease_id": grant.lease_id,
        }
    finally:
        ray.shutdown()
