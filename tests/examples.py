"""How many generated cases a property test runs.

Each hypothesis test names its `make test` count through `examples(n)`, which CI runs as is.
A bench run raises every count at once: `SWITCHYARD_EXAMPLES_SCALE=20 make test` (or the same
variable before a `pytest` of chosen files) runs twenty times as many cases per test. Other
randomized tests keep their own variables (docs/benchmarks.md, "Longer randomized runs").
"""

from __future__ import annotations

import os

SCALE_ENV = "SWITCHYARD_EXAMPLES_SCALE"


def examples(ci_count: int) -> int:
    """`ci_count` times the scale in $SWITCHYARD_EXAMPLES_SCALE (default 1)."""
    text = os.environ.get(SCALE_ENV, "1")
    try:
        scale = float(text)
    except ValueError:
        raise ValueError(f"${SCALE_ENV}={text!r}: expected a number, such as 20") from None
    if scale <= 0:
        raise ValueError(f"${SCALE_ENV}={text!r}: expected a number above 0")
    return max(1, round(ci_count * scale))
