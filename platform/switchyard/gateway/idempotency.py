"""Idempotent retries: one upstream call per (team, Idempotency-Key), its response replayed.

The store is a seam: `InMemoryIdempotencyStore` serves one process (tests, benchmarks); the
cluster adapter (`switchyard.cluster.gateway_idempotency`) puts the same logic in a named,
detached actor so every replica shares it and it outlives a replica restart.

Protocol: `claim` returns a `Claim` saying what to do. `owner` means "make the call, then
`complete` or `abandon`"; `replay` carries the stored response; `conflict` means the key was
used with a different body; `wait` means another request with this key is in flight (the
caller polls `claim` again until it resolves).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass(frozen=True)
class Claim:
    outcome: Literal["owner", "replay", "conflict", "wait"]
    response: StoredResponse | None = None


class IdempotencyStore(Protocol):
    async def claim(self, scope: str, key: str, body_hash: str) -> Claim: ...

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None: ...

    async def abandon(self, scope: str, key: str) -> None:
        """The owner failed in a way a retry may fix: forget the claim."""
        ...


def body_fingerprint(flow: str, raw_body: bytes) -> str:
    return hashlib.sha256(flow.encode() + b"\0" + raw_body).hexdigest()


@dataclass
class _Entry:
    body_hash: str
    expires_at: float
    response: StoredResponse | None = None  # None while the owner is still working
    claimed_at: float = 0.0


class IdempotencyTable:
    """The store's logic without I/O; the in-memory store and the actor both wrap it."""

    def __init__(
        self, ttl_s: float = 24 * 3600, claim_timeout_s: float = 300.0, clock: Callable[[], float] = time.time
    ) -> None:
        self.ttl_s = ttl_s
        self.claim_timeout_s = claim_timeout_s  # a crashed owner's claim lapses after this
        self._clock = clock
        self._entries: dict[tuple[str, str], _Entry] = {}

    def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        now = self._clock()
        self._expire(now)
        entry = self._entries.get((scope, key))
        if entry is None or (entry.response is None and now - entry.claimed_at > self.claim_timeout_s):
            self._entries[(scope, key)] = _Entry(body_hash, now + self.ttl_s, None, now)
            return Claim("owner")
        if entry.body_hash != body_hash:
            return Claim("conflict")
        if entry.response is None:
            return Claim("wait")
        return Claim("replay", entry.response)

    def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        entry = self._entries.get((scope, key))
        if entry is not None:
            entry.response = response
            entry.expires_at = self._clock() + self.ttl_s

    def abandon(self, scope: str, key: str) -> None:
        entry = self._entries.get((scope, key))
        if entry is not None and entry.response is None:
            del self._entries[(scope, key)]

    def _expire(self, now: float) -> None:
        # Amortised: drop expired entries only once the table has grown.
        if len(self._entries) < 1024:
            return
        for k in [k for k, e in self._entries.items() if e.expires_at <= now]:
            del self._entries[k]

    def __len__(self) -> int:
        return len(self._entries)


class InMemoryIdempotencyStore:
    def __init__(self, table: IdempotencyTable | None = None) -> None:
        self.table = table or IdempotencyTable()

    async def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        return self.table.claim(scope, key, body_hash)

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        self.table.complete(scope, key, response)

    async def abandon(self, scope: str, key: str) -> None:
        self.table.abandon(scope, key)
