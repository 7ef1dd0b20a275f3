"""An ASGI app served by uvicorn on 127.0.0.1 in a background thread, for tests and benches
that need real sockets (the fuzzer, latency measurements)."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any

import uvicorn


async def request_body(receive: Any) -> bytes:
    """The whole body of an ASGI request, however many messages it came in."""
    body = b""
    while True:
        msg = await receive()
        body += msg.get("body", b"")
        if not msg.get("more_body"):
            return body


def loopback_listener() -> socket.socket:
    """A socket bound to a free loopback port, for uvicorn's `sockets=`. IPPROTO_TCP is named:
    asyncio sets TCP_NODELAY on accepted sockets only when their proto says TCP, and without it
    each answer's body waits ~40 ms for the client's delayed ACK."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    return sock


class ThreadedServer:
    def __init__(self, app: Any) -> None:
        self.app = app
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> ThreadedServer:
        sock = loopback_listener()
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", lifespan="off", ws="none", access_log=False, loop="asyncio"
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the gateway under test did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
