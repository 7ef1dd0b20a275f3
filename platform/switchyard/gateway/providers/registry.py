"""Build the providers a policy set names, once per catalog, and close them when replaced.

In-cluster providers (kinds `serve` and `local`) need a Serve handle, which only the Ray
adapter can make; it is passed in as `in_cluster`, so this module stays free of Ray.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from switchyard.gateway.credentials import MissingCredential, read_credential
from switchyard.gateway.providers.anthropic_messages import AnthropicProvider
from switchyard.gateway.providers.base import ChatProvider, ProviderError
from switchyard.gateway.providers.bedrock_converse import BedrockProvider
from switchyard.gateway.providers.openai_compat import OpenAICompatProvider
from switchyard.policy.models import ErrorClass, Provider, ProviderCatalog, ProviderKind

log = logging.getLogger(__name__)

InClusterFactory = Callable[[str, Provider], ChatProvider]


class UnreachableProvider:
    """Stands in for a provider that cannot be built (missing credential, no cluster): every
    attempt fails as a connection error that names why, so fallback and metrics still work."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    async def complete(self, call: object) -> object:
        raise ProviderError(ErrorClass.CONNECTION, f"{self.name} is unreachable: {self.reason}")

    async def stream(self, call: object) -> object:
        raise ProviderError(ErrorClass.CONNECTION, f"{self.name} is unreachable: {self.reason}")
        yield  # pragma: no cover  (makes this an async generator)

    async def aclose(self) -> None:
        return None


def build_provider(
    name: str, spec: Provider, in_cluster: InClusterFactory | None, environ: Mapping[str, str] | None = None
) -> ChatProvider:
    try:
        key = read_credential(spec.credential, environ) if spec.credential is not None else None
    except MissingCredential as exc:
        log.warning("provider %s has no credential: %s", name, exc)
        return UnreachableProvider(name, str(exc))  # type: ignore[return-value]
    if spec.kind is ProviderKind.OPENAI:
        if spec.base_url is None:
            return UnreachableProvider(name, "providers.yaml sets no base_url")  # type: ignore[return-value]
        return OpenAICompatProvider(name, spec.base_url, key)
    if spec.kind is ProviderKind.ANTHROPIC:
        return AnthropicProvider(name, spec.base_url or "https://api.anthropic.com", key)
    if spec.kind is ProviderKind.BEDROCK:
        return BedrockProvider(name, spec.region, spec.base_url, spec.timeout_s)
    if in_cluster is None:
        return UnreachableProvider(name, f"kind {spec.kind.value} needs the Ray cluster")  # type: ignore[return-value]
    return in_cluster(name, spec)


def build_providers(
    catalog: ProviderCatalog,
    in_cluster: InClusterFactory | None = None,
    overrides: Mapping[str, ChatProvider] | None = None,
) -> dict[str, ChatProvider]:
    """One provider per catalog entry; `overrides` replaces named ones (in-process fakes)."""
    overrides = overrides or {}
    return {
        name: overrides[name] if name in overrides else build_provider(name, spec, in_cluster)
        for name, spec in catalog.providers.items()
    }
