"""In-cluster providers: a Serve deployment reached through its DeploymentHandle.

The deployment's `chat` method takes an OpenAI chat-completions request (a dict) and
returns an OpenAI chat completion (a dict): `serve_apps/local_model.py` implements it, and
any team's Serve deployment can. One handle hop costs ~8-10 ms here, paid only on the call
to the model, never elsewhere on the gateway's path.

The in-cluster models read text only: each message is sent as `{role, content}` with its
text parts joined (`local_chat_request`), and a call with tools, a tool choice that asks for
a call, tool-call history or image parts is refused (`bad_request`, naming the field) rather
than sent without them. `output` asks for nothing here: the gateway's output contract checks
the answer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from ray import serve
from ray.serve.exceptions import BackPressureError
from ray.serve.handle import DeploymentHandle

from switchyard.gateway.messages import joined_text
from switchyard.gateway.providers.base import (
    Completion,
    Delta,
    EmbeddingCall,
    Embeddings,
    ProviderCall,
    ProviderError,
    ProviderOverloaded,
)
from switchyard.gateway.providers.openai_compat import read_chat_completion
from switchyard.gateway.providers.openai_embeddings import parse_embeddings, request_body
from switchyard.gateway.providers.openai_format import cannot_honour
from switchyard.gateway.providers.registry import InClusterFactory
from switchyard.policy.models import ErrorClass, Provider


class ServeHandleProvider:
    """A chat backend behind a Serve handle: one bound into this app, or a deployment looked up
    by name on first use (`lookup`), so a provider whose deployment is not running (another
    app not deployed yet, the local model's CPU replica when the model is not on GPUs) fails
    its calls with a clear error instead of failing the gateway replica's start."""

    def __init__(
        self,
        name: str,
        handle: DeploymentHandle | None = None,
        lookup: tuple[str, str] | None = None,
    ) -> None:
        if (handle is None) == (lookup is None):
            raise ValueError("a ServeHandleProvider needs exactly one of a handle or (app, deployment)")
        self.name = name
        self._handle = handle
        self._lookup = lookup

    def _resolve(self) -> DeploymentHandle:
        if self._handle is None:
            assert self._lookup is not None
            app, deployment = self._lookup
            try:
                self._handle = serve.get_deployment_handle(deployment, app_name=app)
            except Exception as exc:  # noqa: BLE001  (converted: Serve raises several types here)
                raise ProviderError(
                    ErrorClass.CONNECTION,
                    f"{self.name}: deployment {deployment!r} of app {app!r} is not running ({type(exc).__name__})",
                ) from None
        return self._handle

    async def complete(self, call: ProviderCall) -> Completion:
        payload = local_chat_request(self.name, call)
        handle = self._resolve()
        try:
            data = await handle.chat.remote(payload)
        except BackPressureError as exc:
            # The deployment's queue is full (`max_queued_requests`): busy, not broken.
            queued, max_queued = _queue_depth(exc)
            raise ProviderOverloaded(
                f"{self.name}'s request queue is full",
                queued=queued,
                max_queued=max_queued,
                retry_after_s=getattr(exc, "retry_after_s", None),
            ) from None
        except Exception as exc:  # noqa: BLE001  (converted, not swallowed: see below)
            # Serve raises RayActorError, DeploymentUnavailableError, ...:
            # all mean "this backend cannot answer now", which fallback rules call connection.
            raise ProviderError(
                ErrorClass.CONNECTION, f"{self.name} failed in-cluster ({type(exc).__name__})"
            ) from None
        # A team's own deployment answers here: read as strictly as an HTTP upstream's answer.
        return read_chat_completion(self.name, data, call.model_version)

    async def stream(self, call: ProviderCall) -> AsyncIterator[Delta]:
        done = await self.complete(call)
        yield Delta(text=done.text)
        yield Delta(finish_reason=done.finish_reason, usage=done.usage)

    async def embed(self, call: EmbeddingCall) -> Embeddings:
        """The deployment's `embed` method: an OpenAI embeddings request dict in, an OpenAI
        embeddings response dict (or `{"error": ...}` for an input it refuses) out."""
        handle = self._resolve()
        try:
            data = await handle.embed.remote({**request_body(call), "request_id": call.request_id})
        except BackPressureError as exc:
            queued, max_queued = _queue_depth(exc)  # busy, not broken: as for chat
            raise ProviderOverloaded(
                f"{self.name}'s request queue is full",
                queued=queued,
                max_queued=max_queued,
                retry_after_s=getattr(exc, "retry_after_s", None),
            ) from None
        except Exception as exc:  # noqa: BLE001  (converted, not swallowed: as for chat)
            raise ProviderError(
                ErrorClass.CONNECTION, f"{self.name} failed in-cluster ({type(exc).__name__})"
            ) from None
        return parse_embeddings(self.name, data, call)

    async def aclose(self) -> None:
        return None


def local_chat_request(name: str, call: ProviderCall) -> dict[str, Any]:
    """The text-only chat request an in-cluster deployment's `chat` takes."""
    if call.tools:
        raise _text_only(name, "tools")
    if call.tool_choice not in (None, "none", "auto"):
        raise _text_only(name, "tool_choice")
    payload: dict[str, Any] = {
        "model": call.model_version,
        "messages": [_text_message(name, i, m) for i, m in enumerate(call.messages)],
        "max_tokens": call.max_tokens,
        "request_id": call.request_id,
    }
    if call.temperature is not None:
        payload["temperature"] = call.temperature
    for field_name, value in (("top_p", call.top_p), ("stop", call.stop)):
        if value:
            raise cannot_honour(name, field_name, "the in-cluster model samples with temperature only")
    return payload


def _text_message(name: str, i: int, m: dict[str, Any]) -> dict[str, str]:
    if m.get("role") == "tool":
        raise _text_only(name, f"messages[{i}].role")  # a tool result
    if m.get("tool_calls"):
        raise _text_only(name, f"messages[{i}].tool_calls")
    content = m.get("content")
    for j, part in enumerate(content if isinstance(content, list) else ()):
        if not isinstance(part, dict) or part.get("type") != "text":
            raise _text_only(name, f"messages[{i}].content[{j}]")
    return {"role": m["role"], "content": joined_text(m)}


def _text_only(name: str, field: str) -> ProviderError:
    return cannot_honour(name, field, "the in-cluster model reads text only")


def _queue_depth(exc: BackPressureError) -> tuple[int, int]:
    """(queued, max_queued) from the error's constructor arguments, which Serve keeps in
    `args` so they survive pickling; (0, 0) if a future Serve changes them."""
    queued, max_queued = (*exc.args, 0, 0)[:2]
    return (queued, max_queued) if isinstance(queued, int) and isinstance(max_queued, int) else (0, 0)


def in_cluster_factory(app_name: str, bound: dict[str, DeploymentHandle] | None = None) -> InClusterFactory:
    """Handles for kinds `serve` and `local`: a handle bound into this app by deployment name,
    else `serve.get_deployment_handle` (`deployment: "<app>/<deployment>"` or a name in this app)."""
    bound = bound or {}

    def make(name: str, spec: Provider) -> ServeHandleProvider:
        target = spec.deployment or name
        if target in bound:
            return ServeHandleProvider(name, bound[target])
        app, _, deployment = target.rpartition("/")
        return ServeHandleProvider(name, lookup=(app or app_name, deployment))

    return make
