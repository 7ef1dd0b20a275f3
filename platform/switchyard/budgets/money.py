"""Money as integers: the ledger counts nano-dollars so sums are exact and never drift.

Prices are USD per million tokens; one with at most three decimals (e.g. 0.075) is a whole
number of nano-dollars per token (0.075 $/Mtok = 75 n$/token). A finer one (Gemini's cached
0.01875) is charged at the next whole nano-dollar per token: never less than it costs.
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
    """USD per million tokens -> nano-dollars per token, rounded up (exact for prices with at
    most 3 decimals). It rounded to nearest: 0.0625 was charged 62 n$/token (0.8% under), and
    a price under 0.0005 (0.0004) was 0, so its calls were free."""
    return math.ceil(round(per_mtok_usd * 1000, 6))  # round first: 0.075 * 1000 is 75.00000000000001
