"""In-cluster providers: a Serve deployment reached through its DeploymentHandle.

The deployment's `chat` method takes an OpenAI chat-completions request (a dict) and
returns an OpenAI chat completion (a dict): `serve_apps/local_model.py` implements it, and
any team's Serve deployment can. One handle hop costs ~8-10 ms here, paid only on the call
to the model, never elsewhere on the gateway's path.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.handle import DeploymentHandle

from switchyard.gateway.providers.base import Completion, Delta, ProviderCall, ProviderError
from switchyard.gateway.providers.registry import InClusterFactory
from switchyard.gateway.seams import Usage
from switchyard.policy.models import ErrorClass, Provider


class ServeHandleProvider:
    def __init__(self, name: str, handle: DeploymentHandle) -> None:
        self.name = name
        self._handle = handle

    async def complete(self, call: ProviderCall) -> Completion:
        payload: dict[str, Any] = {
            "model": call.model_version,
            "messages": call.messages,
            "max_tokens": call.max_tokens,
            "request_id": call.request_id,
        }
        if call.temperature is not None:
            payload["temperature"] = call.temperature
        try:
            data = await self._handle.chat.remote(payload)
        except Exception as exc:  # noqa: BLE001  (converted, not swallowed: see below)
            # Serve raises RayActorError, DeploymentUnavailableError, BackPressureError, ...:
            # all mean "this backend cannot answer now", which fallback rules call connection.
            raise ProviderError(
                ErrorClass.CONNECTION, f"{self.name} failed in-cluster ({type(exc).__name__})"
            ) from None
        try:
            choice = data["choices"][0]
            u = data["usage"]
            return Completion(
                choice["message"]["content"] or "",
                Usage(int(u["prompt_tokens"]), int(u["completion_tokens"])),
                choice.get("finish_reason") or "stop",
                str(data.get("model") or call.model_version),
            )
        except (KeyError, IndexError, TypeError):
            raise ProviderError(ErrorClass.SERVER_ERROR, f"{self.name} returned a malformed response") from None

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        done = await self.complete(call)
        yield Delta(text=done.text)
        yield Delta(finish_reason=done.finish_reason, usage=done.usage)

    async def aclose(self) -> None:
        return None


def in_cluster_factory(app_name: str, bound: dict[str, DeploymentHandle] | None = None) -> InClusterFactory:
    """Handles for kinds `serve` and `local`: a handle bound into this app by deployment name,
    else `serve.get_deployment_handle` (`deployment: "<app>/<deployment>"` or a name in this app)."""
    bound = bound or {}

    def make(name: str, spec: Provider) -> ServeHandleProvider:
        target = spec.deployment or name
        if target in bound:
            return ServeHandleProvider(name, bound[target])
        app, _, deployment = target.rpartition("/")
        return ServeHandleProvider(name, serve.get_deployment_handle(deployment, app_name=app or app_name))

    return make
