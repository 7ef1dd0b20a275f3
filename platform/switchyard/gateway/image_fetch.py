"""Downloading a request's image URLs into data URLs, for providers that take only bytes.

The gateway fetches nothing unless a flow sets `image_fetch` (`ImageFetch`). When it does,
`ImageFetcher.inline` replaces each non-data image URL by a `data:` URL of the bytes, under
these rules (each refusal a `BadRequest` `image_fetch_refused`):
- https only (http with `allow_http`); no userinfo; the host, lower-cased, exactly in
  `allowed_hosts`;
- the host is resolved and every address must be public (`address_refusal`) unless
  `allow_private_networks`; the request then goes to the address that was checked;
- no redirects; a 200 with content-type image/png, image/jpeg, image/gif or image/webp,
  no content-encoding, magic bytes matching the type, at most `max_bytes` (streamed, cut off);
- all of it within `min(timeout_s, deadline_s)`.
An upstream failure (timeout, connection, non-200) is `BadRequest` `image_fetch_failed`: the
image is the client's input, not a gateway outage. Messages name the part's JSON path and
the rule, never the URL, host or address: URLs can carry tokens.

DNS rebinding: the host is resolved once, here, and the request is sent to that address
(`https://<ip>/path`) with the `Host` header and the TLS SNI (`sni_hostname`, which Python's
ssl also verifies the certificate against) set to the hostname, so a second, different DNS
answer can never be what we connect to. httpcore pools connections by (scheme, ip, port),
so `_PoolPerHost` keeps one pool per hostname: a kept-alive connection whose certificate was
verified for one host never carries a request for another host on the same address.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from http.cookiejar import CookieJar, DefaultCookiePolicy
from typing import Any

import httpx

from switchyard.gateway.errors import BadRequest, GatewayError, json_path
from switchyard.gateway.messages import Message, is_data_url
from switchyard.policy.models import ImageFetch

Resolver = Callable[[str, int], Awaitable[list[str]]]
"""`(host, port) -> addresses`, in the resolver's order: the seam tests use to point a name
at 127.0.0.1 or at a forbidden address."""

_MAGIC: dict[str, Callable[[bytes], bool]] = {
    "image/png": lambda head: head.startswith(b"\x89PNG\r\n\x1a\n"),
    "image/jpeg": lambda head: head.startswith(b"\xff\xd8\xff"),
    "image/gif": lambda head: head.startswith((b"GIF87a", b"GIF89a")),
    "image/webp": lambda head: head[:4] == b"RIFF" and head[8:12] == b"WEBP",
}
_MAGIC_LEN = 12  # the longest signature above (RIFF....WEBP)

_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def address_refusal(address: str) -> str | None:
    """Why `address` is not a public unicast address the gateway may fetch from; None if it is.

    IPv6 forms that carry an IPv4 address (IPv4-mapped `::ffff:a.b.c.d`, 6to4, NAT64) are
    judged by that IPv4 address: it is where the packets end up."""
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            ip = ip.ipv4_mapped
        elif ip.sixtofour is not None:
            ip = ip.sixtofour
        elif ip in _NAT64:
            ip = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip.is_unspecified:
        return "unspecified"
    if ip.is_loopback:
        return "loopback"
    if ip.is_link_local:  # includes 169.254.169.254, the cloud metadata service
        return "link-local"
    if ip.is_multicast:
        return "multicast"
    if ip.is_reserved:
        return "reserved"
    if ip.is_private:  # RFC 1918, ULA, and the other special-purpose blocks Python lists
        return "private"
    if not ip.is_global:  # e.g. 100.64.0.0/10, carrier-grade NAT
        return "non-global"
    return None


async def resolve_with_loop(host: str, port: int) -> list[str]:
    """The host's addresses from the system resolver, without blocking the event loop."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class _PoolPerHost(httpx.AsyncBaseTransport):
    """One connection pool per requested host (the `Host` header); see the module docstring.
    The number of pools is bounded by the policy: only hosts in some `allowed_hosts` get here."""

    def __init__(self, limits: httpx.Limits) -> None:
        self._limits = limits
        self._pools: dict[str, httpx.AsyncHTTPTransport] = {}

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        host = request.headers["host"]
        pool = self._pools.get(host)
        if pool is None:
            pool = self._pools[host] = httpx.AsyncHTTPTransport(limits=self._limits)
        return await pool.handle_async_request(request)

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


class ImageFetcher:
    """Inlines image URLs under a flow's `ImageFetch` rules; one per gateway, `aclose()` at exit."""

    def __init__(
        self, *, resolve: Resolver = resolve_with_loop, concurrency: int = 4, connections_per_host: int = 4
    ) -> None:
        self._resolve = resolve
        self._concurrency = concurrency
        self._client = httpx.AsyncClient(
            transport=_PoolPerHost(
                httpx.Limits(max_connections=connections_per_host, max_keepalive_connections=connections_per_host)
            ),
            follow_redirects=False,
            trust_env=False,  # an environment proxy would resolve the name itself and undo the pinning
            cookies=CookieJar(policy=DefaultCookiePolicy(allowed_domains=[])),  # no cookies across requests/teams
            headers={
                "Accept": ", ".join(_MAGIC),
                "Accept-Encoding": "identity",  # so max_bytes counts what we hold, not a decompressed bomb
                "User-Agent": "switchyard-image-fetch",
            },
        )

    async def aclose(self) -> None:
        await self._client.aclose()

    async def inline(
        self, messages: list[dict[str, Any]], rules: ImageFetch, deadline_s: float
    ) -> list[dict[str, Any]]:
        """`messages` with every non-data image URL replaced by a data URL of its bytes.

        Fetches at most `concurrency` at once, all within `min(rules.timeout_s, deadline_s)`
        seconds; the first refusal or failure cancels the rest and is raised."""
        found = list(_image_urls(messages))
        if not found:
            return list(messages)
        deadline = asyncio.get_running_loop().time() + min(rules.timeout_s, deadline_s)
        gate = asyncio.Semaphore(self._concurrency)
        try:
            async with asyncio.TaskGroup() as group:
                tasks = {
                    (i, j): group.create_task(self._fetch(json_path(path), url, rules, gate, deadline))
                    for i, j, path, url in found
                }
        except ExceptionGroup as failures:
            raise _first_gateway_error(failures) from None
        return _with_urls(messages, {key: task.result() for key, task in tasks.items()})

    async def _fetch(self, path: str, url: str, rules: ImageFetch, gate: asyncio.Semaphore, deadline: float) -> str:
        try:
            async with asyncio.timeout_at(deadline), gate:
                return await self._download(path, url, rules, deadline)
        except (TimeoutError, httpx.TimeoutException):
            raise _failed(path, "timed out") from None

    async def _download(self, path: str, text: str, rules: ImageFetch, deadline: float) -> str:
        url = _checked_url(path, text, rules)
        host = url.raw_host.decode("ascii")  # IDNA form, what DNS and SNI carry
        port = url.port or (443 if url.scheme == "https" else 80)
        address = await self._checked_address(path, host, port, rules)
        remaining = max(deadline - asyncio.get_running_loop().time(), 0.001)
        try:
            pinned = url.copy_with(host=address)
        except httpx.InvalidURL:  # e.g. a scoped IPv6 address, reachable only with allow_private_networks
            raise _failed(path, "could not connect to the resolved address") from None
        request = self._client.build_request(
            "GET",
            pinned,
            headers={"Host": url.netloc.decode("ascii")},
            extensions={"sni_hostname": host},
            timeout=remaining,
        )
        try:
            response = await self._client.send(request, stream=True)
            try:
                return await _read_image(path, response, rules.max_bytes)
            finally:
                await response.aclose()  # unread bytes are dropped with the connection
        except httpx.TimeoutException:
            raise  # a TransportError too; `_fetch` names it "timed out"
        except httpx.ConnectError:
            raise _failed(path, "could not connect (connection or TLS handshake failed)") from None
        except httpx.TransportError:
            raise _failed(path, "the connection failed while reading the response") from None

    async def _checked_address(self, path: str, host: str, port: int, rules: ImageFetch) -> str:
        """The address to connect to, after every address the host resolves to passed."""
        try:
            addresses = await self._resolve(host, port)
        except OSError:  # socket.gaierror and friends
            raise _failed(path, "the host could not be resolved") from None
        if not addresses:
            raise _failed(path, "the host could not be resolved")
        if not rules.allow_private_networks:
            for address in addresses:
                why = address_refusal(address)
                if why is not None:
                    raise _refused(path, f"the host resolves to a {why} address (image_fetch.allow_private_networks)")
        return addresses[0]


def _checked_url(path: str, text: str, rules: ImageFetch) -> httpx.URL:
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL:
        raise _refused(path, "not a valid URL") from None
    if url.scheme != "https" and not (url.scheme == "http" and rules.allow_http):
        schemes = "https or http (image_fetch.allow_http)" if rules.allow_http else "https"
        raise _refused(path, f"the scheme must be {schemes}")
    if url.userinfo:
        raise _refused(path, "the URL may not carry a user name or password")
    allowed = {host.lower() for host in rules.allowed_hosts}
    if not url.host or not {url.host.lower(), url.raw_host.decode("ascii")} & allowed:  # unicode or IDNA spelling
        raise _refused(path, "the host is not in image_fetch.allowed_hosts")
    return url


async def _read_image(path: str, response: httpx.Response, max_bytes: int) -> str:
    status = response.status_code
    if 300 <= status < 400:
        raise _refused(path, f"the server answered with a redirect ({status}); redirects are not followed")
    if status != 200:
        raise _failed(path, f"the server answered {status}")
    media = response.headers.get("content-type", "").split(";")[0].strip().lower()
    check = _MAGIC.get(media)
    if check is None:
        raise _refused(path, "the content-type is not image/png, image/jpeg, image/gif or image/webp")
    if response.headers.get("content-encoding", "identity").strip().lower() not in ("", "identity"):
        raise _refused(path, "the response has a content-encoding; only identity is accepted")
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise _refused(path, "the image is larger than image_fetch.max_bytes")
    body = bytearray()
    async for chunk in response.aiter_raw():
        body += chunk
        if len(body) > max_bytes:
            raise _refused(path, "the image is larger than image_fetch.max_bytes")
    if not check(bytes(body[:_MAGIC_LEN])):
        raise _refused(path, f"the bytes are not {media} (magic bytes do not match the content-type)")
    return f"data:{media};base64,{base64.b64encode(body).decode('ascii')}"


def _image_urls(messages: Sequence[Message]) -> Iterator[tuple[int, int, list[str | int], str]]:
    """(message index, part index, JSON path, url) of each image part that is not a data URL."""
    for i, message in enumerate(messages):
        content = message.get("content")
        if not isinstance(content, list):
            continue
        for j, part in enumerate(content):
            image = part.get("image_url") if isinstance(part, dict) and part.get("type") == "image_url" else None
            url = image.get("url") if isinstance(image, dict) else None
            if isinstance(url, str) and not is_data_url(url):
                yield i, j, ["messages", i, "content", j, "image_url", "url"], url


def _with_urls(messages: Sequence[Message], urls: dict[tuple[int, int], str]) -> list[Message]:
    """New messages with the parts at `urls`' keys pointing at the new URLs; inputs untouched."""
    out: list[Message] = []
    for i, message in enumerate(messages):
        if not any(key[0] == i for key in urls):
            out.append(message)
            continue
        content = [
            {**part, "image_url": {**part["image_url"], "url": urls[(i, j)]}} if (i, j) in urls else part
            for j, part in enumerate(message["content"])
        ]
        out.append({**message, "content": content})
    return out


def _first_gateway_error(failures: ExceptionGroup[Exception]) -> GatewayError:
    for exc in failures.exceptions:
        if isinstance(exc, GatewayError):
            return exc
    raise failures  # nothing the rules raise: a bug, so it fails loudly


def _refused(path: str, rule: str) -> BadRequest:
    return BadRequest("image_fetch_refused", f"{path}: image fetch refused: {rule}", param=path)


def _failed(path: str, kind: str) -> BadRequest:
    return BadRequest("image_fetch_failed", f"{path}: image fetch failed: {kind}", param=path)
