"""Generated damage for tests that prove a bad file is refused by name or read for what is
left whole: one change to a parsed YAML document (policies, training job specs: a key deleted or
added, a value replaced by one of another type or sign, a name that points nowhere, a number
scaled, a list item doubled), and one damage to a file of appended lines (`damage_lines`)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

OTHER_VALUES: tuple[Any, ...] = (
    None,
    0,
    -1,
    10**15,
    1.5,
    math.nan,
    math.inf,
    -math.inf,
    "",
    "ghost",
    True,
    [],
    {},
    ["ghost"],
    {"ghost": 1},
)


def mutate(doc: Any, draw: Any) -> tuple[Any, str]:
    """`doc` with one thing changed somewhere in it, and what was changed."""
    path: list[Any] = []
    node = doc
    while isinstance(node, dict | list) and node and draw(st.integers(0, 99)) >= 30:
        key = draw(st.sampled_from(sorted(node, key=str) if isinstance(node, dict) else list(range(len(node)))))
        path.append(key)
        node = node[key]
    if not path:
        return draw(st.sampled_from(OTHER_VALUES)), "the whole file replaced"
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    last = path[-1]
    where = "/".join(map(str, path))
    op = draw(st.sampled_from(("delete", "replace", "rename", "scale", "double", "add_key")))
    value = parent[last]
    if op == "delete":
        del parent[last]
        return doc, f"{where} deleted"
    if op == "rename" and isinstance(value, str):
        parent[last] = f"{value}-ghost"
        return doc, f"{where} renamed to {parent[last]!r}"
    if op == "scale" and isinstance(value, int | float) and not isinstance(value, bool):
        factor = draw(st.sampled_from((0, -1, 1000, 0.5)))
        parent[last] = value * factor
        return doc, f"{where} times {factor}"
    if op == "double" and isinstance(parent, list):
        parent.insert(last, value)
        return doc, f"{where} doubled"
    if op == "add_key" and isinstance(value, dict):
        value["ghost"] = draw(st.sampled_from(OTHER_VALUES))
        return doc, f"{where}: unknown key added"
    parent[last] = draw(st.sampled_from(OTHER_VALUES))
    return doc, f"{where} replaced by {parent[last]!r}"


def damage_lines(path: Path, data: Any, junk: Callable[[bytes], bytes]) -> str:
    """One drawn damage to a file of lines the platform appended (a journal, a spool): a byte
    changed anywhere, a line deleted, doubled, swapped with the next or preceded by `junk(line)`,
    or the end cut off (at least the last newline). Returns what was done."""
    raw = path.read_bytes()
    lines = raw.split(b"\n")[:-1]
    how = data.draw(st.sampled_from(["flip", "flip", "delete", "double", "swap", "junk", "cut"]), label="damage")
    if how == "flip" or not lines:
        at = data.draw(st.integers(0, len(raw) - 1), label="byte")
        path.write_bytes(raw[:at] + bytes([raw[at] ^ data.draw(st.integers(1, 255))]) + raw[at + 1 :])
        return f"byte {at} of {len(raw)} changed"
    if how == "cut":
        keep = data.draw(st.integers(len(raw) - len(lines[-1]) - 1, len(raw) - 1), label="cut at")
        path.write_bytes(raw[:keep])
        return f"cut at byte {keep} of {len(raw)}"
    n = data.draw(st.integers(0, len(lines) - 1), label="line")
    if how == "swap" and n + 1 < len(lines):
        lines[n], lines[n + 1] = lines[n + 1], lines[n]
    elif how == "double":
        lines.insert(n, lines[n])
    elif how == "junk":
        lines.insert(n, junk(lines[n]))
    else:
        how = "delete"
        del lines[n]
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return f"line {n + 1} of {len(lines)}: {how}"
