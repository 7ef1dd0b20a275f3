"""Spend reports: budget lines (limit, spent, reserved, reset) and spend by team, flow, model
and day; one shape for the CLI and the admin endpoint. A team's view holds its own lines only."""

from __future__ import annotations

from typing import Any, Protocol

from switchyard.budgets.ledger import LineStatus, SpendRow
from switchyard.budgets.money import nanos_to_usd


class SpendSource(Protocol):
    """A `BudgetLedger`, a `LedgerService`, or anything else that can read them."""

    def lines(self, key_prefixes: list[str] | None = None) -> list[LineStatus]: ...

    def spend(self, team: str | None = None, since_day: str | None = None) -> list[SpendRow]: ...


def team_prefixes(team: str) -> list[str]:
    """The budget lines that belong to a team (not the org's, which spans every team)."""
    return [f"team:{team}:", f"flow:{team}/", f"user:{team}/"]


def spend_report(source: SpendSource, team: str | None, since_day: str | None = None) -> dict[str, Any]:
    lines = source.lines(None if team is None else team_prefixes(team))
    rows = source.spend(team, since_day)
    return {
        "team": team,
        "since": since_day,
        "budgets": [
            {
                "budget": s.key,
                "limit_usd": nanos_to_usd(s.limit_nanos),
                "spent_usd": nanos_to_usd(s.spent_nanos),
                "reserved_usd": nanos_to_usd(s.reserved_nanos),
                "remaining_usd": nanos_to_usd(s.remaining_nanos),
                "resets_at": s.resets_at,
            }
            for s in lines
        ],
        "spend": [
            {
                "day": r.day,
                "team": r.team,
                "flow": r.flow,
                "model": r.model,
                "usd": nanos_to_usd(r.nanos),
                "requests": r.requests,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
            }
            for r in rows
        ],
        "total_usd": nanos_to_usd(sum(r.nanos for r in rows)),
    }
