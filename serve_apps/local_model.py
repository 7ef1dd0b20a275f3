"""switchyard's small GPT as a Serve deployment (`local-model`), the `local` provider.

`chat(request)` takes an OpenAI chat-completions request dict and returns a chat
completion dict; `embed(request)` takes an OpenAI embeddings request dict (`input` a list of
strings) and returns an embeddings response dict, or `{"error": ...}` for an input it refuses.
Both run in a worker thread so the replica keeps serving health checks. Checkpoints: the
newest complete `step-*` folder under `checkpoints_dir`, else the project's seeded
initialisation.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from typing import Any

from ray import serve

from switchyard.cluster.grant_holds import serve_gpu_options

REFRESH_EVERY_S = 5.0


# max_queued_requests bounds the requests each caller (gateway replica) may have waiting for a
# free slot; beyond it the handle raises BackPressureError at once, which the gateway answers
# 503 `overloaded` with Retry-After (or falls back) instead of letting requests queue past
# their deadlines.
@serve.deployment(
    name="local-model",
    num_replicas=1,
    ray_actor_options={"num_cpus": 0.5},
    max_ongoing_requests=8,
    max_queued_requests=32,
)
class LocalModel:
    def __init__(self, checkpoints_dir: str | None = None, preset: str = "tiny") -> None:
        # Imported here: the gateway imports this module to bind the deployment, and its
        # replicas should not load torch.
        from switchyard.gateway.local_model import LocalChatModel

        self.model = LocalChatModel(checkpoints_dir, preset=preset)
        self._checked_at = time.monotonic()

    async def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        await self._refresh_if_due()
        return await asyncio.to_thread(self.model.chat, request)

    async def embed(self, request: dict[str, Any]) -> dict[str, Any]:
        await self._refresh_if_due()
        return await asyncio.to_thread(self.model.embeddings, request)

    async def _refresh_if_due(self) -> None:
        now = time.monotonic()
        if now - self._checked_at > REFRESH_EVERY_S:
            # A newer checkpoint of the model (a training job checkpointed) is served from here
            # on; checked on the request path, at most every few seconds, so no task to manage.
            self._checked_at = now
            await asyncio.to_thread(self.model.refresh)

    def info(self) -> dict[str, Any]:
        return {
            "source": self.model.loaded.source,
            "path": self.model.loaded.path,
            "model_version": self.model.loaded.model_version,
        }


def gpu_options(args: Mapping[str, str]) -> dict[str, Any]:
    """`LocalModel.options(...)` for the app args that put it on GPUs in the inference pool:
    `local_model_gpus` per replica (default 0: CPU only, no options) and
    `local_model_max_replicas`, which the platform computes from the inference quota
    (`switchyard.cluster.serve_configs.max_replicas`; see `deploy.deploy_gateway`). Above one
    replica, Serve autoscales between `local_model_min_replicas` (default 1) and that bound
    (`local_model_upscale_delay_s`,
    `local_model_downscale_delay_s` tune how fast)."""
    gpus = int(args.get("local_model_gpus", "0"))
    if gpus <= 0:
        return {}
    if "local_model_max_replicas" not in args:
        raise ValueError("local_model_gpus needs local_model_max_replicas (from the team's inference quota)")
    bound = int(args["local_model_max_replicas"])
    if bound < 1:
        raise ValueError(f"local_model_max_replicas must be at least 1, got {bound}")
    floor = int(args.get("local_model_min_replicas", "1"))
    if not 1 <= floor <= bound:
        raise ValueError(f"local_model_min_replicas must be between 1 and {bound} (the quota), got {floor}")
    # Its GPUs and as many Serve slots: it never lands on GPUs granted to a starting job.
    options: dict[str, Any] = {"ray_actor_options": serve_gpu_options(gpus, LocalModel.ray_actor_options)}
    if bound > 1:
        options["autoscaling_config"] = {
            "min_replicas": floor,
            "initial_replicas": floor,
            "max_replicas": bound,
            "target_ongoing_requests": 2,
            "upscale_delay_s": float(args.get("local_model_upscale_delay_s", "30")),
            "downscale_delay_s": float(args.get("local_model_downscale_delay_s", "600")),
        }
    return options
