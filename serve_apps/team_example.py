"""A team's own Serve app, as teams write them: here vision's `tagger`, deployed from its config
in `serve_apps/configs/vision.yaml`. It does nothing heavy (it tags a text by its length); what
matters is its shape: a GPU deployment in an app whose name says its team (`vision--tagger`),
so the scheduler places its replicas in the inference pool and counts them against vision's
quota. HTTP enters through a CPU-only front: with Serve's direct ingress an ingress replica
drains for at least 30 s when stopped, and GPUs should go back to the pool sooner than that.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle
from starlette.requests import Request


# A GPU replica asks for as many `switchyard_serve_gpu` slots as GPUs: the platform holds the
# slots of GPUs granted to other workloads, so a replica never lands on those (docs/live_scheduler.md).
@serve.deployment(
    name="tagger", ray_actor_options={"num_cpus": 0, "num_gpus": 1, "resources": {"switchyard_serve_gpu": 1}}
)
class Tagger:
    def tag(self, text: str) -> dict[str, Any]:
        return {"text": text, "tag": "long" if len(text) > 40 else "short"}


@serve.deployment(name="front", ray_actor_options={"num_cpus": 0})
class Front:
    def __init__(self, tagger: DeploymentHandle) -> None:
        self.tagger = tagger

    async def __call__(self, request: Request) -> dict[str, Any]:
        result: dict[str, Any] = await self.tagger.tag.remote((await request.body()).decode())
        return result


app = Front.bind(Tagger.bind())  # type: ignore[attr-defined]
