"""The HTTP adapters' connection to their upstream: one aiohttp keep-alive pool per provider,
and every transport failure turned into the `ProviderError` class fallback rules read.

Why aiohttp and not httpx: httpx's pool checks every idle connection's socket (one `poll(2)`
each) and reassigns its queue on every request, ~13% of a loaded replica's CPU
(docs/benchmarks.md, "Gateway performance"); aiohttp learns that a connection closed from the
event loop (`connection_lost`) and takes an idle one without a system call.

How each failure is classified (the same as the httpx adapters did, see docs/gateway.md):
- the connection cannot be made (refused, unreachable, DNS): `connection`, nothing billed;
- no connection within the timeout (connect, or waiting for a free one in the pool):
  `timeout`, nothing billed (nothing was sent);
- no byte within the timeout after the request was sent (an upstream that accepts and hangs,
  or stalls mid-body or mid-stream): `timeout`, billed at the bound (the provider may finish,
  and bill, an answer nobody reads);
- the upstream closes the connection mid-answer, or answers what is not HTTP: `connection`;
  billed at the bound when the answer's status was 200 (the provider made the answer; the
  streaming adapters apply the same rule to a stream that began with 200).
The timeout is per operation (connect, then each read), as httpx's was: a stream that keeps
sending is never cut off by its length.
"""

from __future__ import annotations

import json
import ssl
import urllib.request
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import aiohttp
import aiohttp.http_exceptions
import certifi
from yarl import URL

from switchyard.gateway import json_text
from switchyard.gateway.providers import answers
from switchyard.gateway.providers.base import ProviderError
from switchyard.policy.models import ErrorClass

# Below the idle timeout most servers close keep-alive connections after (uvicorn's 5 s), so
# the pool drops a connection before its server does, not while a request is being sent on it.
KEEPALIVE_S = 4.0
_JSON = {"content-type": "application/json"}
READ_CHUNK = 2**16


@dataclass(frozen=True)
class UpstreamAnswer:
    """A whole (non-streamed) answer: its status, headers and body."""

    status: int
    headers: Mapping[str, str]  # case-insensitive (aiohttp's CIMultiDictProxy)
    body: bytes

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json_text.loads(self.body)


class UpstreamStream:
    """A streamed answer: status and headers first, then its body read line by line, at most
    `max_bytes` of it (an upstream that sends without end must not fill the replica's memory)."""

    def __init__(self, name: str, response: aiohttp.ClientResponse, max_bytes: int) -> None:
        self.name = name
        self._response = response
        self.status = response.status
        self.headers: Mapping[str, str] = response.headers
        self.max_bytes = max_bytes

    def _too_long(self) -> ProviderError:
        return ProviderError(
            ErrorClass.SERVER_ERROR, f"{self.name} sent an answer longer than {self.max_bytes:,} bytes"
        )

    async def read(self) -> UpstreamAnswer:
        if (self._response.content_length or 0) > self.max_bytes:
            raise self._too_long()
        body = bytearray()
        async for chunk in self._response.content.iter_chunked(READ_CHUNK):
            body += chunk
            if len(body) > self.max_bytes:
                raise self._too_long()
        return UpstreamAnswer(self.status, self.headers, bytes(body))

    async def lines(self) -> AsyncIterator[str]:
        """The body's lines without their line ending (`\\n` or `\\r\\n`), as SSE frames them.
        A line longer than aiohttp's reader takes (512 KiB: an upstream that sends a whole long
        answer as one event) is a malformed answer."""
        seen = 0
        try:
            async for raw in self._response.content:
                seen += len(raw)
                if seen > self.max_bytes:
                    raise self._too_long()
                yield raw.decode("utf-8", errors="replace").rstrip("\r\n")
        except aiohttp.http_exceptions.LineTooLong:
            raise ProviderError(
                ErrorClass.SERVER_ERROR, f"{self.name} sent a stream line longer than 512 KiB"
            ) from None


class UpstreamHTTP:
    """One upstream's keep-alive pool. Built anywhere; it opens on first use, on the event loop
    that uses it (a Serve replica builds its providers before any loop runs)."""

    def __init__(self, name: str, base_url: str, headers: dict[str, str], max_connections: int) -> None:
        self.name = name
        self._base = base_url.rstrip("/") + "/"
        self._headers = {**headers, **_JSON}
        self._max_connections = max_connections
        self._proxy = env_proxy(self._base)
        self._session: aiohttp.ClientSession | None = None
        self._urls: dict[str, URL] = {}  # path -> parsed URL: parsed once, not per request

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            # httpx verified against certifi's CA bundle; the same bundle, so the same upstreams verify.
            tls = ssl.create_default_context(cafile=certifi.where()) if self._base.startswith("https:") else None
            connector = aiohttp.TCPConnector(
                limit=self._max_connections, keepalive_timeout=KEEPALIVE_S, ssl=tls if tls is not None else True
            )
            # Not trust_env: it reads ~/.netrc and the proxy variables in a worker thread on every
            # request; the proxy is read once instead (`env_proxy`), as httpx did.
            self._session = aiohttp.ClientSession(connector=connector, headers=self._headers)
        return self._session

    def _url(self, path: str) -> URL:
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = URL(self._base + path)
        return url

    async def post(self, path: str, body: dict[str, Any], timeout_s: float, max_bytes: int) -> UpstreamAnswer:
        async with self.stream(path, body, timeout_s, max_bytes) as answer:
            return await answer.read()

    @asynccontextmanager
    async def stream(
        self, path: str, body: dict[str, Any], timeout_s: float, max_bytes: int
    ) -> AsyncIterator[UpstreamStream]:
        """POST `body` as JSON; failures while connecting, sending or reading the body (inside
        the `async with`) raise classified `ProviderError`s, an answer over `max_bytes` among
        them. Once the status was 200, every failure inside is billed (the provider made, and
        may bill, the answer, however its body ends), but an error the provider reported in its
        stream (`answers.ErrorEvent`). Leaving early closes the connection rather than
        returning a half-read one to the pool."""
        timeout = aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)
        # httpx's encoding, byte for byte: compact, UTF-8 as it is, NaN refused.
        data = json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
        answered = False
        try:
            # Never a redirect: the prompt, and a credential in a header aiohttp keeps across
            # hosts (Anthropic's x-api-key), would go to a host the catalog does not name.
            # httpx, before, did not follow them either.
            post = self._open().post(
                self._url(path), data=data, timeout=timeout, proxy=self._proxy, allow_redirects=False
            )
            async with post as response:
                answered = response.status == 200
                yield UpstreamStream(self.name, response, max_bytes)
        except (aiohttp.ClientError, TimeoutError) as exc:
            error = transport_error(self.name, exc)
        except ProviderError as exc:  # raised reading the body, here or by the adapter
            error = exc
        else:
            return
        if answered and not isinstance(error, answers.ErrorEvent):
            error.billed = True
        raise error from None

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def env_proxy(url: str) -> str | None:
    """The proxy `HTTP_PROXY` / `HTTPS_PROXY` / `ALL_PROXY` name for `url`, unless `NO_PROXY`
    exempts its host: what httpx applied, read when the client is built, as httpx read it."""
    proxies = urllib.request.getproxies_environment()
    parsed = URL(url)
    # Untyped in typeshed, documented in urllib.request: NO_PROXY as curl and httpx read it.
    if urllib.request.proxy_bypass_environment(parsed.host or "", proxies):  # type: ignore[attr-defined]
        return None
    proxy = proxies.get(parsed.scheme) or proxies.get("all")
    if not proxy:
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


def transport_error(name: str, exc: aiohttp.ClientError | TimeoutError) -> ProviderError:
    if isinstance(exc, aiohttp.SocketTimeoutError):
        # Sent whole, then no byte in time: the provider may finish, and bill, the answer.
        return ProviderError(ErrorClass.TIMEOUT, f"{name} timed out (read)", billed=True)
    if isinstance(exc, TimeoutError):
        # No connection in time (connect, or a free one from the pool): nothing was sent.
        return ProviderError(ErrorClass.TIMEOUT, f"{name} timed out (connect)")
    return ProviderError(ErrorClass.CONNECTION, f"{name} connection failed ({type(exc).__name__})")
