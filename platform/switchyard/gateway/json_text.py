"""JSON text from outside the gateway, parsed so that every way it can be bad is a `ValueError`.

An upstream's answer or error body, a model's output checked against a contract, a tool
call's arguments in a client's request: Python's parser raises `RecursionError` (not a
`ValueError`) for arrays or objects nested past about a thousand levels, and that used to
escape every `except ValueError` around these reads as the gateway's 500. (The request body
itself is read by `wire`, which names its own limits.)
"""

from __future__ import annotations

import json
from typing import Any


class TooDeep(ValueError):
    """The text nests arrays or objects deeper than Python's parser goes."""


def loads(text: str | bytes | bytearray) -> Any:
    try:
        return json.loads(text)
    except RecursionError:
        raise TooDeep("JSON nested too deeply to read") from None
