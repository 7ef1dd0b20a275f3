"""The live set of provider clients, rebuilt when `providers.yaml` changes."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from switchyard.gateway.providers.base import ChatProvider
from switchyard.gateway.providers.registry import InClusterFactory, build_providers
from switchyard.policy.policy_set import PolicySet

log = logging.getLogger(__name__)


class ProviderPool:
    def __init__(
        self, in_cluster: InClusterFactory | None = None, overrides: Mapping[str, ChatProvider] | None = None
    ) -> None:
        self._in_cluster = in_cluster
        self._overrides = dict(overrides or {})
        self._catalog_hash: str | None = None
        self._providers: dict[str, ChatProvider] = {}
        self._retired: list[ChatProvider] = []

    def sync(self, ps: PolicySet) -> None:
        digest = ps.file_hashes.get("providers.yaml", "")
        if digest == self._catalog_hash:
            return
        # Old clients may still serve in-flight requests; they are closed at shutdown.
        self._retired += [p for name, p in self._providers.items() if name not in self._overrides]
        self._providers = build_providers(ps.providers, self._in_cluster, self._overrides)
        self._catalog_hash = digest
        log.info("provider clients built for catalog %s", digest[:12])

    def get(self, name: str) -> ChatProvider:
        return self._providers[name]

    async def aclose(self) -> None:
        for p in [*self._retired, *self._providers.values()]:
            await p.aclose()
        self._retired = []
