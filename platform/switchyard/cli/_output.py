"""Printing helpers shared by the CLI commands: one JSON object, or a readable table."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, sort_keys=True, default=str)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for n, row in enumerate(cells):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
        if n == 0:
            print("  ".join("-" * w for w in widths))


def fail(message: str, code: int = 2) -> int:
    print(f"switchyard: error: {message}", file=sys.stderr)
    return code
