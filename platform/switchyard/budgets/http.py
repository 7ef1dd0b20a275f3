"""The spend admin endpoint, as a router the gateway app mounts.

`GET /admin/spend?team=T&since=YYYY-MM-DD`: the report of `switchyard.budgets.report`. A team
admin sees only its own team (its team is the default when `team` is omitted); auditors and
platform admins may omit `team` to see every team.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, HTTPException, Request

from switchyard.budgets.report import SpendSource, spend_report
from switchyard.policy.keys import Principal
from switchyard.policy.models import Role
from switchyard.policy.roles import Action, Forbidden, authorize

DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}", re.ASCII)


def spend_router(source: Callable[[], SpendSource], authenticate: Callable[[Request], Principal]) -> APIRouter:
    """`source()` returns the ledger to read; `authenticate(request)` the caller (or raises)."""
    router = APIRouter()

    @router.get("/admin/spend")
    def read_spend(request: Request, team: str | None = None, since: str | None = None) -> dict[str, Any]:
        who = authenticate(request)
        if team is None and who.role is Role.TEAM_ADMIN:
            team = who.team
        if since is not None and not DAY.fullmatch(since):
            # The value is not echoed: error bodies never carry what was sent.
            raise HTTPException(400, f"query parameter `since`: expected YYYY-MM-DD ({len(since)} characters sent)")
        try:
            authorize(who, Action.READ_SPEND, team)
        except Forbidden as exc:
            raise HTTPException(403, exc.public) from exc
        return spend_report(source(), team, since)

    return router
