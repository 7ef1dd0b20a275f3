"""Requests with an Idempotency-Key, as the pipeline runs them: claim the key, then run the
request once, replay its stored answer, or refuse.

The key is claimed in the shared store (`switchyard.gateway.idempotency`). The owner's call
runs in a task the pipeline owns: a client that hangs up (its handler cancelled) does not cut
it short, and its answer is stored, so the client's retry with the key replays it instead of
calling (and paying) again. A claim still being made when its client hangs up is freed once
made, or that client's retry would wait on it until it lapsed (stop 48).

The store gets until the request's deadline, as the budget ledger does: a store stuck behind
another session's lock answers 503 in time, and the claim is withdrawn, or freed once made
(stop 49).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from switchyard.gateway.errors import BadRequest, DeadlineExceeded, IdempotencyConflict, Unavailable
from switchyard.gateway.idempotency import (
    Claim,
    IdempotencyStore,
    IdempotencyUnavailable,
    StoredResponse,
    body_fingerprint,
    complete_later,
    forget_claim,
)
from switchyard.gateway.results import H_REPLAY, H_REQUEST_ID, H_SDK_REQUEST_ID, JSONResult, Result, error_result
from switchyard.gateway.seams import RequestContext

log = logging.getLogger(__name__)

Own = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class KeyedRequests:
    def __init__(
        self,
        own: Own,
        timer: Callable[[], float],
        poll_s: float,
        pseudonym: Callable[[str, str], str] | None,
    ) -> None:
        """`own`: runs work in a task the pipeline owns (its shutdown waits for it).
        `pseudonym`: (team, user) -> the user's audit pseudonym, which names stored answers."""
        self._own = own
        self._timer = timer
        self._poll_s = poll_s
        self._pseudonym = pseudonym

    async def run(
        self,
        store: IdempotencyStore,
        ctx: RequestContext,
        raw: bytes,
        hdr: dict[str, str],
        execute: Callable[[], Awaitable[Result]],
        answered_here: Callable[[JSONResult], JSONResult],
    ) -> Result:
        """`execute` runs the request; `answered_here` counts an answer the store gave without
        running it (a replay, a conflict, a refusal)."""
        key = ctx.idempotency_key or ""
        if len(key) > 255:
            invalid = BadRequest(
                "invalid_idempotency_key", "Idempotency-Key is longer than 255 characters", param="Idempotency-Key"
            )
            return answered_here(error_result(invalid, hdr))
        if ctx.stream:
            unsupported = BadRequest(
                "idempotent_stream_unsupported",
                "Idempotency-Key is supported on non-streaming requests only",
                param="stream",
            )
            return answered_here(error_result(unsupported, hdr))
        digest = body_fingerprint(ctx.flow.flow, raw)
        while True:
            claiming = asyncio.ensure_future(store.claim(ctx.team, key, digest))
            try:
                async with asyncio.timeout(max(ctx.deadline - self._timer(), 0.0)):
                    claim = await asyncio.shield(claiming)
            except (asyncio.CancelledError, TimeoutError) as exc:
                # The client left, or its deadline passed, while the key was being claimed. A
                # claim made is freed; one still being made is withdrawn, or freed once made,
                # by the store (`IdempotencyStore.claim`).
                if claiming.done():
                    self._free_if_owned(store, ctx.team, key)(claiming)
                else:
                    claiming.cancel()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                log.error("request %s: the idempotency store did not answer before the deadline", ctx.request_id)
                slow = Unavailable(
                    "idempotency_unavailable",
                    "the idempotency store did not answer before the request's deadline; the request was not run",
                    headers={"retry-after": "1"},
                )
                return answered_here(error_result(slow, hdr))
            except IdempotencyUnavailable as exc:
                log.error("request %s: %s", ctx.request_id, exc)
                down = Unavailable(
                    "idempotency_unavailable",
                    "the idempotency store cannot be reached right now; the request was not run",
                    headers={"retry-after": "1"},
                )
                return answered_here(error_result(down, hdr))
            if claim.outcome == "owner":
                break
            if claim.outcome == "replay" and claim.response is not None:
                stored = claim.response
                replayed = {
                    **stored.headers,
                    H_REPLAY: "true",
                    H_REQUEST_ID: ctx.request_id,
                    H_SDK_REQUEST_ID: ctx.request_id,
                    "x-switchyard-original-request-id": stored.headers.get(H_REQUEST_ID, ""),
                }
                return answered_here(JSONResult(stored.status, stored.body, replayed))
            if claim.outcome == "conflict":
                conflict = IdempotencyConflict(
                    "idempotency_key_reused",
                    "this Idempotency-Key was used with a different request body",
                    param="Idempotency-Key",
                )
                return answered_here(error_result(conflict, hdr))
            # In flight on another request: poll for its answer until the deadline, which then
            # is this key's (504), not the store's (the store answered every poll).
            await asyncio.sleep(min(self._poll_s, max(ctx.deadline - self._timer(), 0.0)))
            if self._timer() >= ctx.deadline:
                late = DeadlineExceeded(
                    "deadline_exceeded",
                    "a request with this Idempotency-Key is still in flight and the deadline passed",
                )
                return answered_here(error_result(late, hdr))
        result: Result = await asyncio.shield(self._own(self._run_claimed(store, ctx, key, execute)))
        return result

    def _free_if_owned(self, store: IdempotencyStore, team: str, key: str) -> Callable[[asyncio.Future[Claim]], None]:
        def free(claiming: asyncio.Future[Claim]) -> None:
            # `exception()` also marks a failed claim's error as seen: nobody is left to handle it.
            if claiming.cancelled() or claiming.exception() is not None:
                return
            if claiming.result().outcome == "owner":
                self._own(forget_claim(store, team, key))

        return free

    async def _run_claimed(
        self, store: IdempotencyStore, ctx: RequestContext, key: str, execute: Callable[[], Awaitable[Result]]
    ) -> Result:
        """Run a request whose key this replica claimed; store its answer, or free the key for a
        retry when it failed."""
        try:
            result = await execute()
        except BaseException:
            self._own(forget_claim(store, ctx.team, key))
            raise
        if isinstance(result, JSONResult) and result.status == 200:
            storing = self._own(self._store(store, ctx, key, result))
            try:  # the answer waits for its storing until the deadline, not for a stuck store
                async with asyncio.timeout(max(ctx.deadline - self._timer(), 0.0)):
                    await asyncio.shield(storing)
            except TimeoutError:
                log.warning("request %s: the answer goes out before it is stored (the deadline)", ctx.request_id)
        else:
            self._own(forget_claim(store, ctx.team, key))  # failures are not stored: a retry may succeed
        return result

    async def _store(self, store: IdempotencyStore, ctx: RequestContext, key: str, result: JSONResult) -> None:
        stored = StoredResponse(result.status, result.body, result.headers, await self._subject(ctx))
        try:
            await store.complete(ctx.team, key, stored)
        except IdempotencyUnavailable as exc:
            # Answered and charged: the answer goes out, and it is stored once the store is
            # back, so a retry meanwhile waits on the claim rather than running (and paying) again.
            log.error("request %s: storing the answer failed, retrying in the background: %s", ctx.request_id, exc)
            self._own(complete_later(store, ctx.team, key, stored))

    async def _subject(self, ctx: RequestContext) -> str | None:
        """The end user's pseudonym (what erasure finds stored answers by), if there is one."""
        if ctx.user is None or self._pseudonym is None:
            return None
        return await asyncio.to_thread(self._pseudonym, ctx.team, ctx.user)
