"""switchyard's small GPT as a Serve deployment (`local-model`), the `local` provider.

`chat(request)` takes an OpenAI chat-completions request dict and returns a chat
completion dict; generation runs in a worker thread so the replica keeps serving health
checks. Checkpoints: the newest complete `step-*` folder under `checkpoints_dir`, else the
project's seeded initialisation.
"""

from __future__ import annotations

import asyncio
from typing import Any

from ray import serve


@serve.deployment(name="local-model", num_replicas=1, ray_actor_options={"num_cpus": 0.5}, max_ongoing_requests=8)
class LocalModel:
    def __init__(self, checkpoints_dir: str | None = None, preset: str = "tiny") -> None:
        # Imported here: the gateway imports this module to bind the deployment, and its
        # replicas should not load torch.
        from switchyard.gateway.local_model import LocalChatModel

        self.model = LocalChatModel(checkpoints_dir, preset=preset)

    async def chat(self, request: dict[str, Any]) -> dict[str, Any]:
        return await asyncio.to_thread(self.model.chat, request)

    def info(self) -> dict[str, Any]:
        return {
            "source": self.model.loaded.source,
            "path": self.model.loaded.path,
            "model_version": self.model.loaded.model_version,
        }
