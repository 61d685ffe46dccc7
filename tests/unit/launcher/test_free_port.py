"""free_port picks ports the kernel never hands an outgoing connection, so a broker restarted on its port can bind
it again (a chaos test's restart once failed in CI for 10 s with "Address already in use")."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from launcher import broker
from launcher.broker import PORTS_FROM, ephemeral_low, free_port


def test_ports_are_below_the_ephemeral_range_and_bindable() -> None:
    low = ephemeral_low()
    assert low is not None, "this test machine is Linux: /proc/sys/net/ipv4/ip_local_port_range exists"
    assert low - PORTS_FROM >= 1000, f"the ephemeral range starts at {low}: nothing below it to pick from here"
    ports = [free_port() for _ in range(50)]
    assert all(PORTS_FROM <= port < low for port in ports), ports
    assert len(set(ports)) > 40, ports  # random picks, not one port over and over
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((broker.HOST, ports[-1]))  # free right after it was picked


def test_a_port_in_use_is_never_picked(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """With a range that leaves exactly one candidate below it taken, every pick falls back to the OS's choice."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind((broker.HOST, 0))
        taken.listen()
        busy = taken.getsockname()[1]
        fake = tmp_path / "ip_local_port_range"
        fake.write_text(f"{busy + 1}\t60999\n")
        monkeypatch.setattr(broker, "EPHEMERAL_RANGE", fake)
        monkeypatch.setattr(broker, "PORTS_FROM", busy + 1 - 1000)
        monkeypatch.setattr(broker.random, "sample", lambda population, k: [busy] * k)
        assert free_port() != busy


def test_where_the_range_is_unknown_the_os_picks(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(broker, "EPHEMERAL_RANGE", tmp_path / "absent")
    assert ephemeral_low() is None
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((broker.HOST, port))
