"""A number with the formula that produced it, so every line of a plan can show its working."""

from __future__ import annotations

from dataclasses import dataclass

from switchyard.train.plan.hardware import GIB


@dataclass(frozen=True)
class Term:
    value: float
    """Bytes, seconds or FLOPs, as the field holding the term says."""
    formula: str
    """The symbolic formula, then the numbers substituted, e.g. `2·Ψ/N = 2·70.6e9/64`."""


def count(n: float) -> str:
    """A parameter or token count short enough for a formula: 70.6e9, 4096."""
    return f"{n:.4g}" if n < 1e6 else f"{n / 1e9:.4g}e9" if n >= 1e9 else f"{n / 1e6:.4g}e6"


def gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB"


ZERO = Term(0.0, "0")
