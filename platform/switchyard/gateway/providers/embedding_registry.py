"""The embedders a catalog names, built once per `providers.yaml` (the embeddings twin of
`registry.py` and `gateway/pool.py`).

Only providers that serve a model with `task: embedding` get one. Kinds `openai` and `bedrock`
get their own clients; `serve` and `local` use the in-cluster provider the chat pool already
built for that name (one Serve handle per deployment; `ServeHandleProvider.embed`), passed in
as `in_cluster` so this module stays free of Ray. A provider that cannot embed (no credential,
no cluster, a deployment client without `embed`, Anthropic, which has no embeddings API) gets
an `UnreachableEmbedder`: every attempt fails as `connection`, naming why, so metrics and the
audit record show it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TypeGuard

from switchyard.gateway.credentials import MissingCredential, read_credential
from switchyard.gateway.providers.base import EmbeddingCall, EmbeddingProvider, Embeddings, ProviderError
from switchyard.gateway.providers.bedrock_embeddings import BedrockEmbeddingsProvider
from switchyard.gateway.providers.openai_embeddings import OpenAIEmbeddingsProvider
from switchyard.policy.models import ErrorClass, Provider, ProviderKind
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)

# (provider name, spec) -> the in-cluster client for it; it embeds if it has `embed`.
InClusterClients = Callable[[str, Provider], object]


class UnreachableEmbedder:
    """Stands in for an embedder that cannot be built: every attempt fails as `connection`."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        self.reason = reason

    async def embed(self, call: EmbeddingCall) -> Embeddings:
        raise ProviderError(ErrorClass.CONNECTION, f"{self.name} cannot embed: {self.reason}")


def can_embed(client: object) -> TypeGuard[EmbeddingProvider]:
    return callable(getattr(client, "embed", None)) and isinstance(getattr(client, "name", None), str)


def build_embedder(
    name: str, spec: Provider, in_cluster: InClusterClients | None, environ: Mapping[str, str] | None = None
) -> EmbeddingProvider:
    try:
        key = read_credential(spec.credential, environ) if spec.credential is not None else None
    except MissingCredential as exc:
        log.warning("provider %s has no credential: %s", name, exc)
        return UnreachableEmbedder(name, str(exc))
    if spec.kind is ProviderKind.OPENAI:
        if spec.base_url is None:
            return UnreachableEmbedder(name, "providers.yaml sets no base_url")
        return OpenAIEmbeddingsProvider(name, spec.base_url, key)
    if spec.kind is ProviderKind.BEDROCK:
        return BedrockEmbeddingsProvider(name, spec.region, spec.base_url, spec.timeout_s)
    if spec.kind is ProviderKind.ANTHROPIC:
        return UnreachableEmbedder(name, "the Anthropic API has no embeddings endpoint")
    if in_cluster is None:
        return UnreachableEmbedder(name, f"kind {spec.kind.value} needs the Ray cluster")
    client = in_cluster(name, spec)
    if not can_embed(client):
        return UnreachableEmbedder(name, f"its in-cluster client ({type(client).__name__}) has no embed method")
    return client


def embedding_providers(ps: PolicySet) -> set[str]:
    """The providers that serve at least one embedding model of the catalog."""
    return {m.provider for m in ps.providers.models.values() if m.task == "embedding"}


class EmbedderPool:
    """The live embedders, rebuilt when `providers.yaml` changes. Closes only the clients it
    built (in-cluster ones belong to the chat pool, overrides to their test)."""

    def __init__(
        self,
        in_cluster: InClusterClients | None = None,
        overrides: Mapping[str, EmbeddingProvider] | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.in_cluster = in_cluster
        self._overrides = dict(overrides or {})
        self._environ = environ
        self._catalog_hash: str | None = None
        self._embedders: dict[str, EmbeddingProvider] = {}
        self._owned: list[EmbeddingProvider] = []  # built here, closed at `aclose` (old ones serve in-flight calls)

    def sync(self, ps: PolicySet) -> None:
        digest = ps.file_hashes.get("providers.yaml", "")
        if digest == self._catalog_hash:
            return
        built: dict[str, EmbeddingProvider] = {}
        for name in sorted(embedding_providers(ps)):
            if name in self._overrides:
                built[name] = self._overrides[name]
                continue
            spec = ps.providers.providers[name]
            built[name] = build_embedder(name, spec, self.in_cluster, self._environ)
            if spec.kind in (ProviderKind.OPENAI, ProviderKind.BEDROCK):
                self._owned.append(built[name])
        self._embedders = built
        self._catalog_hash = digest
        log.info("embedding clients built for catalog %s: %s", digest[:12], ", ".join(built) or "none")

    def get(self, name: str) -> EmbeddingProvider:
        """The embedder of a provider that serves an embedding model (KeyError for any other:
        asking for one is a bug)."""
        return self._embedders[name]

    async def aclose(self) -> None:
        for embedder in self._owned:
            close = getattr(embedder, "aclose", None)
            if close is not None:
                await close()
        self._owned = []
