"""Budget periods: UTC calendar days and months, their keys and when they reset."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta
from enum import StrEnum


class Period(StrEnum):
    DAY = "day"
    MONTH = "month"


def utc(ts: float) -> datetime:
    return datetime.fromtimestamp(ts, tz=UTC)


def utc_day(ts: float) -> date:
    """The UTC calendar day of a Unix time: the day whose price and budgets apply."""
    return utc(ts).date()


def period_label(period: Period, ts: float) -> str:
    """`2026-11-30` for a day, `2026-11` for a month: part of every budget key."""
    t = utc(ts)
    return t.strftime("%Y-%m-%d") if period is Period.DAY else t.strftime("%Y-%m")


def period_end(period: Period, ts: float) -> datetime:
    """The first instant of the next period (when the budget resets)."""
    t = utc(ts)
    if period is Period.DAY:
        return datetime(t.year, t.month, t.day, tzinfo=UTC) + timedelta(days=1)
    year, month = (t.year + 1, 1) if t.month == 12 else (t.year, t.month + 1)
    return datetime(year, month, 1, tzinfo=UTC)
