"""Argument types for numbers a command cannot mean: refused by argparse, naming the flag.

`type=int` alone takes any integer, and several flags size what a command builds (a simulated
cluster's nodes, a local Ray head's GPUs, a query's rows), so a stray digit used all of a
machine's memory or reached a database driver that cannot hold it (stop 44).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from datetime import date


def int_between(low: int, high: int) -> Callable[[str], int]:
    """A whole number from `low` to `high`, both included."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"{text} is not between {low:,} and {high:,}")
        return value

    return parse


def positive_seconds(text: str) -> float:
    """A finite number of seconds above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text} is not a finite number of seconds above 0")
    return value


def utc_day(text: str) -> str:
    """A calendar day, `YYYY-MM-DD`, as given. (A day that does not exist, such as 2026-13-45,
    was compared as text with the ledger's days and matched nothing, in silence: stop 44.)"""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)") from None
    if day.isoformat() != text:  # fromisoformat also takes 20261205 and 2026-W49-6
        raise argparse.ArgumentTypeError(f"{text!r} is not a day (YYYY-MM-DD)")
    return text
