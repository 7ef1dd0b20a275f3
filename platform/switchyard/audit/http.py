"""The audit admin endpoint, as a FastAPI router the gateway app mounts.

`GET /admin/audit/records?team=&flow=&since=&bodies=` and `GET /admin/audit/verify`, with the
caller's API key in `Authorization: Bearer`. Team admins read their team; auditors all.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Query

from switchyard.audit.query import AuditQuery, AuditReader, parse_since
from switchyard.audit.store import AuditStore
from switchyard.policy.keys import Principal
from switchyard.policy.roles import Action, Forbidden, authorize


def audit_router(reader: AuditReader, store: AuditStore, verify_key: Callable[[str], Principal | None]) -> APIRouter:
    """`verify_key` is the gateway's key check (e.g. `KeyStore.verifier().verify`)."""
    router = APIRouter(prefix="/admin/audit", tags=["audit"])

    def caller(authorization: str | None) -> Principal:
        scheme, _, key = (authorization or "").partition(" ")
        who = verify_key(key.strip()) if scheme.lower() == "bearer" else None
        if who is None:
            raise HTTPException(401, "Authorization: Bearer <key> is missing, unknown or revoked")
        return who

    @router.get("/records")
    def records(
        authorization: Annotated[str | None, Header()] = None,
        team: str | None = None,
        flow: str | None = None,
        since: str | None = None,
        bodies: bool = False,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> dict[str, Any]:
        who = caller(authorization)
        try:
            since_ts = None if since is None else parse_since(since)
        except ValueError as exc:
            raise HTTPException(400, str(exc)) from exc
        try:
            found = reader.query(who, AuditQuery(team, flow, since_ts, bodies, limit))
        except Forbidden as exc:
            raise HTTPException(403, exc.public) from exc
        return {"records": found, "count": len(found)}

    @router.get("/verify")
    def verify(authorization: Annotated[str | None, Header()] = None) -> dict[str, Any]:
        who = caller(authorization)
        try:
            authorize(who, Action.READ_AUDIT, None)
        except Forbidden as exc:
            raise HTTPException(403, exc.public) from exc
        findings = store.verify()
        head_seq, head_hash = store.head()
        return {
            "ok": not findings,
            "entries": head_seq,
            "head": head_hash,
            "findings": [{"seq": f.seq, "problem": f.problem, "detail": f.detail} for f in findings],
        }

    return router
