"""`ImageFetcher` against a real HTTP server on 127.0.0.1 (a stdlib server in a thread, so
each route controls its status line, headers and how many bytes it sends), and the address
classifier as a pure function. Loopback is reachable only because the rules here allow it
explicitly (`allow_private_networks=True, allow_http=True`)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import struct
import threading
import time
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from switchyard.gateway.errors import BadRequest
from switchyard.gateway.image_fetch import ImageFetcher, Resolver, address_refusal
from switchyard.policy.models import ImageFetch

ASYNC = pytest.mark.asyncio(loop_scope="session")
SECRET = "sig-TOKEN-1234"  # in every URL's query: must never reach an error message
PATH = "messages[1].content[1].image_url.url"


def _png() -> bytes:
    """A real 1x1 RGBA PNG."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", 1, 1, 8, 6, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", header)
        + chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00\xff"))
        + chunk(b"IEND", b"")
    )


PNG = _png()
JPEG = b"\xff\xd8\xff\xe0\x00\x10JFIF\x00" + b"\x00" * 20 + b"\xff\xd9"
GIF = b"GIF89a\x01\x00\x01\x00\x00\x00\x00;"
WEBP = b"RIFF\x1a\x00\x00\x00WEBPVP8L\x0d\x00\x00\x00/\x00\x00\x00\x10\x07\x10\x11\x11\x88\x88\xfe\x07\x00"
BIG_CHUNK = 64 * 1024
BIG_TOTAL = 64 * 1024 * 1024  # far above what loopback socket buffers can hold


class ImageServer(ThreadingHTTPServer):
    """Routes by path; records what it saw and, for `/big`, how much it managed to send."""

    daemon_threads = False  # `server_close` joins every handler thread: no stray threads after a test

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.port = self.server_address[1]
        self.lock = threading.Lock()
        self.requests = 0
        self.hosts: list[str] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self.big_sent = 0
        self.big_done = threading.Event()
        self.release = threading.Event()  # ends the slow route's wait at teardown
        self.errors: list[BaseException] = []

    def url(self, route: str) -> str:
        return f"http://127.0.0.1:{self.port}{route}?token={SECRET}"

    def handle_error(self, request: Any, client_address: Any) -> None:
        import sys

        self.errors.append(sys.exc_info()[1] or RuntimeError("unknown handler error"))


class _Handler(BaseHTTPRequestHandler):
    server: ImageServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the tests assert on the server's records instead."""

    def do_GET(self) -> None:
        with self.server.lock:
            self.server.requests += 1
            self.server.hosts.append(self.headers.get("Host", ""))
        route = self.path.split("?", 1)[0]
        ROUTES[route](self)

    def answer(self, status: int, body: bytes, content_type: str, **headers: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name.replace("_", "-"), value)
        self.end_headers()
        self.wfile.write(body)

    def big(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "image/png")  # no Content-Length: only the stream can be cut
        self.end_headers()
        chunk = PNG[:8] + b"\x00" * (BIG_CHUNK - 8)
        try:
            while self.server.big_sent < BIG_TOTAL:
                self.wfile.write(chunk)
                self.server.big_sent += len(chunk)
        except OSError:  # the fetcher hung up: what this test wants
            pass
        finally:
            self.server.big_done.set()

    def slow(self) -> None:
        self.server.release.wait(timeout=10)
        with contextlib.suppress(OSError):  # the fetcher timed out and left
            self.answer(200, PNG, "image/png")

    def hold(self) -> None:
        with self.server.lock:
            self.server.in_flight += 1
            self.server.max_in_flight = max(self.server.max_in_flight, self.server.in_flight)
        time.sleep(0.1)
        with self.server.lock:
            self.server.in_flight -= 1
        self.answer(200, PNG, "image/png")


ROUTES: dict[str, Callable[[_Handler], None]] = {
    "/ok.png": lambda h: h.answer(200, PNG, "image/png"),
    "/ok.jpg": lambda h: h.answer(200, JPEG, "image/jpeg"),
    "/ok.gif": lambda h: h.answer(200, GIF, "image/gif; charset=binary"),
    "/ok.webp": lambda h: h.answer(200, WEBP, "image/webp"),
    "/html": lambda h: h.answer(200, PNG, "text/html"),
    "/svg": lambda h: h.answer(200, b"<svg/>", "image/svg+xml"),
    "/mismatch": lambda h: h.answer(200, GIF, "image/png"),
    "/gzip": lambda h: h.answer(200, zlib.compress(PNG), "image/png", Content_Encoding="gzip"),
    "/declared-big": lambda h: h.answer(200, PNG + b"\x00" * 4096, "image/png"),
    "/redirect": lambda h: h.answer(302, b"", "text/plain", Location="http://169.254.169.254/latest/meta-data/"),
    "/missing": lambda h: h.answer(404, b"no", "text/plain"),
    "/big": _Handler.big,
    "/slow": _Handler.slow,
    "/hold": _Handler.hold,
}


@pytest.fixture
def server() -> Iterator[ImageServer]:
    srv = ImageServer()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.release.set()
    srv.shutdown()
    srv.server_close()
    thread.join(timeout=10)
    assert not srv.errors


@pytest.fixture
async def make_fetcher() -> AsyncIterator[Callable[..., ImageFetcher]]:
    made: list[ImageFetcher] = []

    def make(**kwargs: Any) -> ImageFetcher:
        made.append(ImageFetcher(**kwargs))
        return made[-1]

    yield make
    for fetcher in made:
        await fetcher.aclose()


def local(**overrides: Any) -> ImageFetch:
    """Rules that let the test reach its own server on 127.0.0.1 over http."""
    rules: dict[str, Any] = {
        "allowed_hosts": frozenset({"127.0.0.1"}),
        "allow_http": True,
        "allow_private_networks": True,
    }
    return ImageFetch(**(rules | overrides))


def chat(url: str) -> list[dict[str, Any]]:
    """The image at `messages[1].content[1]`, next to parts that must pass through untouched."""
    return [
        {"role": "system", "content": "describe images"},
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "what is this?"},
                {"type": "image_url", "image_url": {"url": url, "detail": "low"}},
                {"type": "image_url", "image_url": {"url": "data:image/gif;base64,R0lGODlh"}},
            ],
        },
    ]


def fixed(*addresses: str) -> Resolver:
    async def resolve(host: str, port: int) -> list[str]:
        return list(addresses)

    return resolve


async def refusal(call: Awaitable[object], code: str, url: str, *words: str) -> BadRequest:
    """The BadRequest `call` raised: its code, the part's path, the rule, and no trace of the URL."""
    with pytest.raises(BadRequest) as caught:
        await call
    err = caught.value
    assert err.code == code, err.message
    assert err.message.startswith(f"{PATH}: ") and err.param == PATH
    for word in words:
        assert word in err.message
    text = f"{err.message} {err} {err.body()} {err.__cause__!r} {err.__context__!r}"
    assert SECRET not in text and url not in text and "://" not in text
    return err


# --- inlined ------------------------------------------------------------------------------


@ASYNC
async def test_png_inlined_as_data_url_and_inputs_untouched(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    messages = chat(server.url("/ok.png"))
    before = copy.deepcopy(messages)
    out = await make_fetcher().inline(messages, local(), 5.0)
    assert messages == before
    image = out[1]["content"][1]["image_url"]
    assert image == {"url": "data:image/png;base64," + base64.b64encode(PNG).decode(), "detail": "low"}
    assert out[0] == before[0]
    assert out[1]["content"][0] == before[1]["content"][0] and out[1]["content"][2] == before[1]["content"][2]
    assert server.requests == 1 and server.hosts == [f"127.0.0.1:{server.port}"]


@ASYNC
@pytest.mark.parametrize(
    ("route", "media", "body"),
    [("/ok.jpg", "image/jpeg", JPEG), ("/ok.gif", "image/gif", GIF), ("/ok.webp", "image/webp", WEBP)],
)
async def test_each_image_type_inlined(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher], route: str, media: str, body: bytes
) -> None:
    out = await make_fetcher().inline(chat(server.url(route)), local(), 5.0)
    assert out[1]["content"][1]["image_url"]["url"] == f"data:{media};base64," + base64.b64encode(body).decode()


@ASYNC
async def test_messages_without_urls_need_no_fetch(make_fetcher: Callable[..., ImageFetcher]) -> None:
    messages = [{"role": "user", "content": "hi"}, chat("data:image/png;base64,AAAA")[1]]
    assert await make_fetcher().inline(messages, local(allowed_hosts=frozenset()), 5.0) == messages


@ASYNC
async def test_connects_to_the_checked_address_with_the_hostname_as_host(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    calls: list[tuple[str, int]] = []

    async def resolve(host: str, port: int) -> list[str]:
        calls.append((host, port))
        return ["127.0.0.1"]

    url = f"http://Images.Test:{server.port}/ok.png?token={SECRET}"
    rules = local(allowed_hosts=frozenset({"images.test"}))
    out = await make_fetcher(resolve=resolve).inline(chat(url), rules, 5.0)
    assert out[1]["content"][1]["image_url"]["url"].startswith("data:image/png;base64,")
    # Resolved once, by us; the socket went to that address, the request named the host.
    assert calls == [("images.test", server.port)]
    assert server.hosts == [f"images.test:{server.port}"]


@ASYNC
async def test_fetches_concurrently_but_bounded(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    parts = [{"type": "image_url", "image_url": {"url": server.url("/hold")}} for _ in range(10)]
    out = await make_fetcher(concurrency=4).inline([{"role": "user", "content": parts}], local(), 5.0)
    assert all(p["image_url"]["url"].startswith("data:image/png;") for p in out[0]["content"])
    assert server.requests == 10 and 1 < server.max_in_flight <= 4


# --- refused before any connection ------------------------------------------------------


@ASYNC
async def test_http_refused_without_allow_http(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = server.url("/ok.png")
    await refusal(make_fetcher().inline(chat(url), local(allow_http=False), 5.0), "image_fetch_refused", url, "https")
    assert server.requests == 0


@ASYNC
@pytest.mark.parametrize("url", [f"ftp://127.0.0.1/x?token={SECRET}", f"file:///etc/passwd?{SECRET}", "not a url"])
async def test_other_schemes_refused(make_fetcher: Callable[..., ImageFetcher], url: str) -> None:
    await refusal(make_fetcher().inline(chat(url), local(), 5.0), "image_fetch_refused", url, "scheme")


@ASYNC
async def test_host_not_in_allowed_hosts_refused(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    url = server.url("/ok.png")
    rules = local(allowed_hosts=frozenset({"images.example.com", "127.0.0.10"}))
    await refusal(make_fetcher().inline(chat(url), rules, 5.0), "image_fetch_refused", url, "allowed_hosts")
    sub = f"https://evil.images.example.com/x.png?token={SECRET}"  # exact match only: no suffixes
    await refusal(make_fetcher().inline(chat(sub), rules, 5.0), "image_fetch_refused", sub, "allowed_hosts")
    assert server.requests == 0


@ASYNC
async def test_userinfo_refused(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = f"http://user:{SECRET}@127.0.0.1:{server.port}/ok.png"
    await refusal(make_fetcher().inline(chat(url), local(), 5.0), "image_fetch_refused", url, "user name")
    assert server.requests == 0


REFUSED = [
    ("127.0.0.1", "loopback"),
    ("127.8.9.10", "loopback"),
    ("::1", "loopback"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("192.168.1.1", "private"),
    ("fd00:ec2::254", "private"),  # ULA; AWS's IPv6 metadata address
    ("fc00::1", "private"),
    ("169.254.169.254", "link-local"),  # cloud metadata
    ("169.254.0.1", "link-local"),
    ("fe80::1", "link-local"),
    ("fe80::1%eth0", "link-local"),
    ("224.0.0.1", "multicast"),
    ("239.255.255.250", "multicast"),
    ("ff02::1", "multicast"),
    ("ff0e::1", "multicast"),  # global-scope multicast is still not a server
    ("240.0.0.1", "reserved"),
    ("255.255.255.255", "reserved"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("100.64.0.1", "non-global"),  # carrier-grade NAT
    ("192.0.2.1", "private"),  # documentation
    ("198.18.0.1", "private"),  # benchmarking
    ("::ffff:127.0.0.1", "loopback"),  # IPv4-mapped forms judged by their IPv4 address
    ("::ffff:169.254.169.254", "link-local"),
    ("::ffff:10.0.0.1", "private"),
    ("::ffff:0.0.0.0", "unspecified"),
    ("2002:a00:1::", "private"),  # 6to4 wrapping 10.0.0.1
    ("2002:7f00:1::", "loopback"),  # 6to4 wrapping 127.0.0.1
    ("64:ff9b::a9fe:a9fe", "link-local"),  # NAT64 wrapping 169.254.169.254
    ("::127.0.0.1", "reserved"),  # deprecated IPv4-compatible form
    ("2001:db8::1", "private"),  # documentation
]
PUBLIC = ["8.8.8.8", "93.184.216.34", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "64:ff9b::808:808"]


@pytest.mark.parametrize(("address", "why"), REFUSED)
def test_address_classifier_refuses_non_public(address: str, why: str) -> None:
    assert address_refusal(address) == why


@pytest.mark.parametrize("address", PUBLIC)
def test_address_classifier_accepts_public(address: str) -> None:
    assert address_refusal(address) is None


@ASYNC
async def test_loopback_refused_without_allow_private_networks(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    url = server.url("/ok.png")
    rules = local(allow_private_networks=False)
    await refusal(make_fetcher().inline(chat(url), rules, 5.0), "image_fetch_refused", url, "loopback")
    assert server.requests == 0


@ASYNC
@pytest.mark.parametrize(
    ("addresses", "why"),
    [
        (["169.254.169.254"], "link-local"),
        (["::ffff:127.0.0.1"], "loopback"),
        (["93.184.216.34", "10.0.0.7"], "private"),  # every address must pass, not just the first
    ],
)
async def test_resolved_private_addresses_refused(
    make_fetcher: Callable[..., ImageFetcher], addresses: list[str], why: str
) -> None:
    url = f"https://images.test/cat.png?token={SECRET}"
    rules = ImageFetch(allowed_hosts=frozenset({"images.test"}))
    fetcher = make_fetcher(resolve=fixed(*addresses))
    await refusal(fetcher.inline(chat(url), rules, 5.0), "image_fetch_refused", url, why, "allow_private_networks")


@ASYNC
async def test_unresolvable_host_fails(make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = f"https://images.test/cat.png?token={SECRET}"
    rules = ImageFetch(allowed_hosts=frozenset({"images.test"}))
    await refusal(make_fetcher(resolve=fixed()).inline(chat(url), rules, 5.0), "image_fetch_failed", url, "resolved")


# --- refused on the response ------------------------------------------------------------


@ASYNC
async def test_body_over_max_bytes_cut_off(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = server.url("/big")
    rules = local(max_bytes=BIG_CHUNK)
    await refusal(make_fetcher().inline(chat(url), rules, 10.0), "image_fetch_refused", url, "max_bytes")
    assert await asyncio.to_thread(server.big_done.wait, 10)
    # The server could not write past what the socket buffers held once the fetcher hung up.
    assert server.big_sent < BIG_TOTAL // 4, server.big_sent


@ASYNC
async def test_declared_length_over_max_bytes_refused(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    url = server.url("/declared-big")
    await refusal(make_fetcher().inline(chat(url), local(max_bytes=1024), 5.0), "image_fetch_refused", url, "max_bytes")


@ASYNC
@pytest.mark.parametrize(
    ("route", "words"),
    [
        ("/html", ("content-type",)),
        ("/svg", ("content-type",)),
        ("/mismatch", ("magic bytes", "image/png")),
        ("/gzip", ("content-encoding",)),
        ("/redirect", ("redirect", "302")),
    ],
)
async def test_bad_responses_refused(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher], route: str, words: tuple[str, ...]
) -> None:
    url = server.url(route)
    await refusal(make_fetcher().inline(chat(url), local(), 5.0), "image_fetch_refused", url, *words)
    assert server.requests == 1  # a redirect is not followed


@ASYNC
async def test_first_refusal_cancels_the_other_fetches(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    url = server.url("/html")
    messages = chat(url)
    messages[1]["content"][2] = {"type": "image_url", "image_url": {"url": server.url("/slow")}}
    started = time.monotonic()
    await refusal(make_fetcher().inline(messages, local(timeout_s=30), 30), "image_fetch_refused", url, "content-type")
    assert time.monotonic() - started < 2  # did not wait for the slow part


# --- upstream failures ------------------------------------------------------------------


@ASYNC
async def test_slow_server_times_out(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = server.url("/slow")
    started = time.monotonic()
    await refusal(make_fetcher().inline(chat(url), local(timeout_s=0.3), 5.0), "image_fetch_failed", url, "timed out")
    assert time.monotonic() - started < 2


@ASYNC
async def test_request_deadline_shorter_than_rule_wins(
    server: ImageServer, make_fetcher: Callable[..., ImageFetcher]
) -> None:
    url = server.url("/slow")
    started = time.monotonic()
    await refusal(make_fetcher().inline(chat(url), local(timeout_s=30), 0.2), "image_fetch_failed", url, "timed out")
    assert time.monotonic() - started < 2


@ASYNC
async def test_non_200_fails(server: ImageServer, make_fetcher: Callable[..., ImageFetcher]) -> None:
    url = server.url("/missing")
    await refusal(make_fetcher().inline(chat(url), local(), 5.0), "image_fetch_failed", url, "404")


@ASYNC
async def test_connection_refused_fails(make_fetcher: Callable[..., ImageFetcher]) -> None:
    closed = ImageServer()  # a port that was just free: nothing listens once it is closed
    port = closed.port
    closed.server_close()
    url = f"http://127.0.0.1:{port}/ok.png?token={SECRET}"
    await refusal(make_fetcher().inline(chat(url), local(), 5.0), "image_fetch_failed", url, "connect")
