"""Erasure of a subject: its stored answers, its key, and a record that it happened.

Order matters. The pseudonym can only be computed while the key exists, so the stored
idempotent answers go first: if that fails, nothing is erased yet and the command can be
run again. Then the key (bodies unreadable, pseudonym unlinkable), the plaintext bodies of
records written before schema 2, and last the `ErasureRecord` in the chain.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from switchyard.audit.record import ErasureRecord
from switchyard.audit.store import AuditStore
from switchyard.audit.subject_keys import SubjectKeyring, subject_of
from switchyard.gateway.idempotency import IdempotencyStore


async def erase_subject(
    store: AuditStore,
    keyring: SubjectKeyring,
    team: str,
    user: str | None,
    erased_by: str,
    idempotency: IdempotencyStore | None = None,
) -> ErasureRecord:
    """Erase `<team>/<user>`, or with `user=None` the team's own key (the bodies of its
    requests that named no user). Every record and link stays and still verifies.

    `idempotency`: the store the gateway replays answers from; None when none is reachable
    (then the record says `replays_purged=None`, and stored answers expire after their TTL)."""
    subject = subject_of(team, user)
    alias = await asyncio.to_thread(keyring.existing_pseudonym, subject)
    purged = None
    if idempotency is not None:
        purged = 0 if alias is None else await idempotency.purge_subject(team, alias)
    erased = await asyncio.to_thread(keyring.erase, subject, erased_by)
    if idempotency is not None and erased is not None and erased != alias:
        # The subject's first request made it a key between the two reads.
        purged = (purged or 0) + await idempotency.purge_subject(team, erased)
    removed = await asyncio.to_thread(store.remove_plaintext_bodies, team, subject)
    record = ErasureRecord(
        request_id=f"erasure-{uuid.uuid4().hex}",
        time=time.time(),
        team=team,
        subject=erased,
        erased_by=erased_by,
        key_existed=erased is not None,
        replays_purged=purged,
        bodies_removed=removed,
    )
    await asyncio.to_thread(store.append, [record])
    return record
