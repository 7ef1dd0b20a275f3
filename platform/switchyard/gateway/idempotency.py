"""Idempotent retries: one upstream call per (team, Idempotency-Key), its response replayed.

The store is a seam: `InMemoryIdempotencyStore` serves one process (tests, benchmarks); the
SQL store (`switchyard.gateway.idempotency_sql`), which the gateway's replicas use, keeps it
in the shared database, so every replica shares it and it outlives every process. Both apply
the same decisions (`decide_claim`, `after_complete`, ...).

Protocol: `claim` returns a `Claim` saying what to do. `owner` means "make the call, then
`complete` or `abandon`"; `replay` carries the stored response; `conflict` means the key was
used with a different body; `wait` means another request with this key is in flight (the
caller polls `claim` again until it resolves).

Erasure: a stored response names its subject by pseudonym (`StoredResponse.subject`), and
`purge_subject` deletes that subject's responses, so an erased user's answer is not replayed.
A response completed after the purge by a request that was in flight during it carries the
erased pseudonym: it is dropped, not stored (the purge leaves a marker for one TTL).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Literal, Protocol

log = logging.getLogger(__name__)


ANSWER_TTL_S = 24 * 3600.0  # how long a stored answer is replayed
CLAIM_TIMEOUT_S = 300.0  # how long a crashed owner's claim blocks its key (`check_claim_bound`)


class IdempotencyUnavailable(Exception):
    """The store cannot be reached. Before a claim: 503, nothing run or charged. After a
    charged success: the answer is still returned, and storing it is retried."""


@dataclass(frozen=True)
class StoredResponse:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]
    # The request's subject pseudonym (`SubjectKeyring.pseudonym_for(team, user)`): what
    # `purge_subject` finds it by. None: it can only expire (after the TTL).
    subject: str | None = None


@dataclass(frozen=True)
class Claim:
    outcome: Literal["owner", "replay", "conflict", "wait"]
    response: StoredResponse | None = None


class IdempotencyStore(Protocol):
    async def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        """Cancelled before it returns, a claim is either not made or freed by the store once
        made: its caller left, and nobody else would free it."""
        ...

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None: ...

    async def abandon(self, scope: str, key: str) -> None:
        """The owner failed in a way a retry may fix: forget the claim."""
        ...

    async def purge_subject(self, scope: str, subject: str) -> int:
        """Erasure: delete the stored responses of `subject` (a pseudonym) in `scope` and
        refuse to store its responses for one TTL. Returns how many were deleted."""
        ...


def body_fingerprint(flow: str, raw_body: bytes) -> str:
    return hashlib.sha256(flow.encode() + b"\0" + raw_body).hexdigest()


@dataclass(frozen=True)
class IdempotencyEntry:
    """What is stored under one (scope, key): a claim, and once its owner is done, the answer."""

    body_hash: str
    claimed_at: float
    expires_at: float  # kept at least until then; dropped by the next sweep after
    response: StoredResponse | None = None  # None while the owner is still working


# The decisions, as pure functions over one entry: every store (the in-memory table, the SQL
# store) applies these, so they cannot drift. Each returns the entry to keep: the same object
# (no change), a new one (write it) or None (delete it).


def decide_claim(
    entry: IdempotencyEntry | None, body_hash: str, now: float, ttl_s: float, claim_timeout_s: float
) -> tuple[Claim, IdempotencyEntry | None]:
    if entry is None or (entry.response is None and now - entry.claimed_at > claim_timeout_s):
        return Claim("owner"), IdempotencyEntry(body_hash, now, now + ttl_s)
    if entry.body_hash != body_hash:
        return Claim("conflict"), entry
    if entry.response is None:
        return Claim("wait"), entry
    return Claim("replay", entry.response), entry


def after_complete(
    entry: IdempotencyEntry | None, response: StoredResponse, now: float, ttl_s: float, erased_until: float
) -> IdempotencyEntry | None:
    """`erased_until`: when the erasure marker of the response's subject lapses (0: none)."""
    if entry is None:
        return None
    if response.subject is not None and erased_until > now:
        return None  # in flight during an erasure: a retry runs again
    return replace(entry, response=response, expires_at=now + ttl_s)


def after_abandon(entry: IdempotencyEntry | None) -> IdempotencyEntry | None:
    return None if entry is not None and entry.response is None else entry


def erased_by(entry: IdempotencyEntry, subject: str) -> bool:
    """Whether purging `subject` deletes `entry` (a stored answer of that subject)."""
    return entry.response is not None and entry.response.subject == subject


def erasure_until(now: float, ttl_s: float) -> float:
    """A purge's marker lasts one TTL: longer than any claim in flight during it can live."""
    return now + ttl_s


def is_expired(expires_at: float, now: float) -> bool:
    return expires_at <= now


class IdempotencyTable:
    """The store's logic without I/O; the in-memory store and the actor both wrap it."""

    def __init__(
        self,
        ttl_s: float = ANSWER_TTL_S,
        claim_timeout_s: float = CLAIM_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.ttl_s = ttl_s
        self.claim_timeout_s = claim_timeout_s  # a crashed owner's claim lapses after this
        self._clock = clock
        self._entries: dict[tuple[str, str], IdempotencyEntry] = {}
        self._erased: dict[tuple[str, str], float] = {}  # (scope, pseudonym) -> marker expiry

    def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        now = self._clock()
        self._expire(now)
        claim, kept = decide_claim(self._entries.get((scope, key)), body_hash, now, self.ttl_s, self.claim_timeout_s)
        self._keep((scope, key), kept)
        return claim

    def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        now = self._clock()
        until = 0.0 if response.subject is None else self._erased.get((scope, response.subject), 0.0)
        self._keep((scope, key), after_complete(self._entries.get((scope, key)), response, now, self.ttl_s, until))

    def purge_subject(self, scope: str, subject: str) -> int:
        self._erased[(scope, subject)] = erasure_until(self._clock(), self.ttl_s)
        doomed = [k for k, e in self._entries.items() if k[0] == scope and erased_by(e, subject)]
        for k in doomed:
            del self._entries[k]
        return len(doomed)

    def abandon(self, scope: str, key: str) -> None:
        self._keep((scope, key), after_abandon(self._entries.get((scope, key))))

    def _keep(self, where: tuple[str, str], entry: IdempotencyEntry | None) -> None:
        if entry is None:
            self._entries.pop(where, None)
        else:
            self._entries[where] = entry

    def _expire(self, now: float) -> None:
        # Amortised: drop expired entries only once the table has grown.
        if len(self._entries) < 1024:
            return
        for k in [k for k, e in self._entries.items() if is_expired(e.expires_at, now)]:
            del self._entries[k]
        for marker in [m for m, until in self._erased.items() if is_expired(until, now)]:
            del self._erased[marker]

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

    async def purge_subject(self, scope: str, subject: str) -> int:
        return self.table.purge_subject(scope, subject)


async def forget_claim(store: IdempotencyStore, team: str, key: str) -> None:
    """Release a claim whose owner failed. If the store is unreachable, the claim lapses by
    itself after the store's claim timeout."""
    try:
        await store.abandon(team, key)
    except IdempotencyUnavailable as exc:
        log.warning("could not release idempotency claim of team %s; it will lapse: %s", team, exc)


# How `complete_later` waits between its tries to store an answer: 0.25 s doubling to 8 s, 8 tries.
STORE_RETRY_DELAYS_S = tuple(min(0.25 * 2**i, 8.0) for i in range(8))


def check_claim_bound(claim_timeout_s: float, longest_request_s: float) -> None:
    """Refuse a claim timeout under which an owner's claim could lapse while its request still
    runs, or while its answer waits to be stored: a retry would then run (and pay) again."""
    needed = longest_request_s + sum(STORE_RETRY_DELAYS_S)
    if claim_timeout_s < needed:
        raise ValueError(
            f"idempotency claim_timeout_s={claim_timeout_s:g} must be at least the longest flow deadline"
            f" ({longest_request_s:g}) + the time an answer may wait to be stored ({sum(STORE_RETRY_DELAYS_S):g})"
            f" = {needed:g}"
        )


async def complete_later(store: IdempotencyStore, team: str, key: str, stored: StoredResponse) -> None:
    for delay in STORE_RETRY_DELAYS_S:
        await asyncio.sleep(delay)
        try:
            await store.complete(team, key, stored)
            return
        except IdempotencyUnavailable:
            continue
    log.error("an idempotent answer of team %s was never stored; a retry of it will run again", team)
