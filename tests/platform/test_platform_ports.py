"""Listener ports are drawn where no outgoing connection can take them before the listener
binds: HAProxy's stats listener died in CI with "Address already in use" on a port the
kernel had handed out as ephemeral, minutes before HAProxy started."""

from __future__ import annotations

import random
import socket
from pathlib import Path

from switchyard.ports import LISTENER_RANGE_START, ephemeral_range_start, listener_port


def test_listener_ports_are_outside_the_ephemeral_range() -> None:
    start = ephemeral_range_start()
    assert start - LISTENER_RANGE_START >= 1000, "this machine's ephemeral range leaves no room below it"
    ports = [listener_port() for _ in range(50)]
    assert all(LISTENER_RANGE_START <= p < start for p in ports), ports
    assert len(set(ports)) > 40, "two platforms on one machine would keep drawing the same ports"


def test_a_port_with_a_listener_is_never_drawn() -> None:
    seed = 7
    first = random.Random(seed).randrange(LISTENER_RANGE_START, ephemeral_range_start())
    with socket.socket() as held:
        held.bind(("0.0.0.0", first))
        held.listen()
        assert listener_port(random.Random(seed)) != first


def test_an_unreadable_or_cramped_range_falls_back_sanely(tmp_path: Path) -> None:
    assert ephemeral_range_start(tmp_path / "missing") == 32768
    (tmp_path / "garbled").write_text("not numbers")
    assert ephemeral_range_start(tmp_path / "garbled") == 32768
    (tmp_path / "range").write_text("20500\t60999\n")
    assert ephemeral_range_start(tmp_path / "range") == 20500
