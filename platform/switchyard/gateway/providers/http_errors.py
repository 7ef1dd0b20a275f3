"""The HTTP adapters' shared reading of an upstream's error body (the pool and transport
failures are `upstream_http`'s)."""

from __future__ import annotations

from switchyard.gateway import json_text


def upstream_detail(text: str) -> str:
    """The upstream's error type/code only (its message may quote the prompt back)."""
    try:
        data = json_text.loads(text)
    except ValueError:
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return ""
    parts = [str(err[k]) for k in ("type", "code") if isinstance(err.get(k), str)]
    return "/".join(parts)[:120]
