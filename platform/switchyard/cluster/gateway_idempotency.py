"""The idempotency store shared by every gateway replica: one named, detached actor.

A retry may land on another replica, and a replica may restart; the actor outlives both
(it is detached), so a key claimed or completed on one replica is seen by all. It holds
the same `IdempotencyTable` the in-process store uses. The actor itself is one process:
if it dies, stored responses are lost and keys are claimable again (at-least-once, never a
wrong replay), which the docs state.
"""

from __future__ import annotations

import ray
from ray.actor import ActorHandle
from ray.exceptions import ActorUnavailableError, RayActorError

from switchyard.gateway.idempotency import Claim, IdempotencyTable, IdempotencyUnavailable, StoredResponse

ACTOR_NAME = "switchyard-gateway-idempotency"
NAMESPACE = "switchyard"


@ray.remote(num_cpus=0, max_restarts=-1)
class IdempotencyActor:
    def __init__(self, ttl_s: float) -> None:
        self.table = IdempotencyTable(ttl_s=ttl_s)

    def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        return self.table.claim(scope, key, body_hash)

    def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        self.table.complete(scope, key, response)

    def abandon(self, scope: str, key: str) -> None:
        self.table.abandon(scope, key)

    def purge_subject(self, scope: str, subject: str) -> int:
        return self.table.purge_subject(scope, subject)

    def size(self) -> int:
        return len(self.table)


def shared_actor(ttl_s: float = 24 * 3600) -> ActorHandle:
    return IdempotencyActor.options(  # type: ignore[attr-defined,no-any-return]
        name=ACTOR_NAME, namespace=NAMESPACE, lifetime="detached", get_if_exists=True
    ).remote(ttl_s)


class ActorIdempotencyStore:
    """The shared actor as an `IdempotencyStore`; an actor that is gone (dead, restarting)
    is `IdempotencyUnavailable`, which the pipeline answers without running the request."""

    def __init__(self, actor: ActorHandle) -> None:
        self.actor = actor

    async def claim(self, scope: str, key: str, body_hash: str) -> Claim:
        try:
            return await self.actor.claim.remote(scope, key, body_hash)  # type: ignore[no-any-return]
        except (RayActorError, ActorUnavailableError) as exc:
            raise IdempotencyUnavailable(f"the idempotency actor is unavailable ({type(exc).__name__})") from exc

    async def complete(self, scope: str, key: str, response: StoredResponse) -> None:
        try:
            await self.actor.complete.remote(scope, key, response)
        except (RayActorError, ActorUnavailableError) as exc:
            raise IdempotencyUnavailable(f"the idempotency actor is unavailable ({type(exc).__name__})") from exc

    async def abandon(self, scope: str, key: str) -> None:
        try:
            await self.actor.abandon.remote(scope, key)
        except (RayActorError, ActorUnavailableError) as exc:
            raise IdempotencyUnavailable(f"the idempotency actor is unavailable ({type(exc).__name__})") from exc

    async def purge_subject(self, scope: str, subject: str) -> int:
        return await self.actor.purge_subject.remote(scope, subject)  # type: ignore[no-any-return]
