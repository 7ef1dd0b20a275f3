"""The web console as its own Ray Serve application, at `/console` beside the gateway (never on
its request path): one small CPU replica on the head, where the state directory is.

    serve run serve_apps.console:build_app policies_dir=policies state_dir=.switchyard gateway_url=http://127.0.0.1:8000
"""

from __future__ import annotations

import logging
from pathlib import Path

from fastapi import FastAPI
from ray import serve

from switchyard.cluster.placement import on_head
from switchyard.cluster.scheduler_client import RetryPolicy, SchedulerClient, platform_scheduler
from switchyard.console.app import create_console
from switchyard.console.sessions import SessionStore
from switchyard.console.sources import PlatformReader
from switchyard.policy.keys import KeyStore

log = logging.getLogger(__name__)


def _scheduler() -> SchedulerClient | None:
    try:
        return platform_scheduler(RetryPolicy(call_timeout_s=10, deadline_s=10))
    except ValueError:  # no scheduler actor on this cluster: the GPU views say so
        return None


@serve.deployment(name="console", num_replicas=1, ray_actor_options={"num_cpus": 0.1, **on_head()})
@serve.ingress()
class Console:
    def __init__(self, policies_dir: str, state_dir: str, gateway_url: str | None = None) -> None:
        state = Path(state_dir)
        self.reader = PlatformReader(state, Path(policies_dir), _scheduler, gateway_url)
        self.keys = KeyStore.in_state_dir(state)
        self.sessions = SessionStore(self.keys)
        pruned = self.sessions.prune()
        if pruned:
            log.info("pruned %d old console sessions", pruned)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return create_console(self.reader, self.sessions)


def build_app(args: dict[str, str]) -> serve.Application:
    return Console.bind(args["policies_dir"], args["state_dir"], args.get("gateway_url"))  # type: ignore[attr-defined]
