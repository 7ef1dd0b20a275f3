"""Money as integers: the ledger counts nano-dollars so sums are exact and never drift.

Prices are USD per million tokens with at most three decimals (e.g. 0.075), so a price per
token is a whole number of nano-dollars (0.075 $/Mtok = 75 n$/token).
"""

from __future__ import annotations

import math

NANOS_PER_USD = 1_000_000_000


def usd_to_nanos(usd: float) -> int:
    """Round up: a charge or reservation is never smaller than the money it stands for."""
    if usd < 0 or math.isnan(usd) or math.isinf(usd):
        raise ValueError(f"an amount of money must be a finite number >= 0, got {usd!r}")
    return math.ceil(round(usd * NANOS_PER_USD, 3))


def nanos_to_usd(nanos: int) -> float:
    return nanos / NANOS_PER_USD


def per_token_nanos(per_mtok_usd: float) -> int:
    """USD per million tokens -> nano-dollars per token (exact for prices with <= 3 decimals)."""
    return round(per_mtok_usd * 1000)
