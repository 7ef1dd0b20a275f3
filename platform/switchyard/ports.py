"""Ports for the listeners a platform opens on this machine (HAProxy's stats and metrics,
the dashboard, the gateway, a process group's rendezvous).

Asking the kernel for port 0 returns a port from the ephemeral range, which every outgoing
connection on the machine draws its local port from: between choosing such a port and the
listener binding it (seconds later, in another process), Ray's own connections can take it,
and the listener dies with "Address already in use" (seen in CI: HAProxy's stats port).
So a listener port is drawn from below the ephemeral range and above Ray's worker ports,
where only listeners live, and checked free on every interface.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

LISTENER_RANGE_START = 20000  # above Ray's default worker ports (10002-19999)
EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
DEFAULT_EPHEMERAL_START = 32768  # Linux's default when the file cannot be read
ATTEMPTS = 200


def ephemeral_range_start(path: Path = EPHEMERAL_RANGE_FILE) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return DEFAULT_EPHEMERAL_START


def bindable(port: int) -> bool:
    """Whether a listener could bind `port` on all interfaces right now."""
    with socket.socket() as s:
        try:
            s.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def listener_port(rng: random.Random | None = None) -> int:
    """A free port for a listener that binds it later, outside the ephemeral range when the
    machine leaves room below it; otherwise (a machine whose ephemeral range starts low) the
    kernel's choice."""
    draw = rng or random.SystemRandom()
    stop = ephemeral_range_start()
    if stop - LISTENER_RANGE_START >= 1000:
        for _ in range(ATTEMPTS):
            port = draw.randrange(LISTENER_RANGE_START, stop)
            if bindable(port):
                return port
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
