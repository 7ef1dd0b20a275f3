"""The HTTP adapters' shared pieces: one pooled client per provider, and transport failures
and upstream error bodies turned into safe `ProviderError`s."""

from __future__ import annotations

import json

import httpx

from switchyard.gateway.providers.base import ProviderError
from switchyard.policy.models import ErrorClass


def pooled_client(base_url: str, headers: dict[str, str], max_connections: int) -> httpx.AsyncClient:
    """One keep-alive pool per provider; each call passes its own timeout (its deadline's rest)."""
    return httpx.AsyncClient(
        base_url=base_url.rstrip("/") + "/",
        headers=headers,
        limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
    )


def transport_error(name: str, exc: httpx.HTTPError) -> ProviderError:
    if isinstance(exc, httpx.TimeoutException):
        # A read timeout comes after the whole request was sent: the provider may finish, and
        # bill, an answer nobody reads, so it is charged at the bound (as the attempt's own
        # deadline is); a connect, write or pool timeout sent nothing to bill.
        billed = isinstance(exc, httpx.ReadTimeout)
        return ProviderError(ErrorClass.TIMEOUT, f"{name} timed out ({type(exc).__name__})", billed=billed)
    return ProviderError(ErrorClass.CONNECTION, f"{name} connection failed ({type(exc).__name__})")


def upstream_detail(text: str) -> str:
    """The upstream's error type/code only (its message may quote the prompt back)."""
    try:
        data = json.loads(text)
    except ValueError:
        return ""
    err = data.get("error") if isinstance(data, dict) else None
    if not isinstance(err, dict):
        return ""
    parts = [str(err[k]) for k in ("type", "code") if isinstance(err.get(k), str)]
    return "/".join(parts)[:120]
