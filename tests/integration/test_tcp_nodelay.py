"""Nagle's algorithm is off on every MQTT connection the system makes (protocol/transport/sockets.py).

With it on, a small packet written while an earlier one is unacknowledged waits out the peer's delayed
ACK (up to 40 ms on Linux): a round of a small model then spends most of its time waiting.
"""

from __future__ import annotations

import socket
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from launcher.broker import MosquittoBroker
from protocol.transport.mqtt import BrokerAddress, MqttLink
from protocol.transport.sockets import disable_nagle

pytestmark = pytest.mark.integration


def _nodelay(sock: socket.socket) -> int:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)


def test_a_link_turns_nagle_off_on_its_connection(tmp_path: Path) -> None:
    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        assert "set_tcp_nodelay true" in (tmp_path / "broker" / "mosquitto.conf").read_text().splitlines()
        link = MqttLink("nodelay", BrokerAddress.parse(broker.url), lambda *_: None)
        link.start()
        try:
            assert link.wait_connected(30), "the link never connected"
            sock = link._client.socket()  # the connected socket itself: what the kernel was told
            assert isinstance(sock, socket.socket) and _nodelay(sock) != 0
        finally:
            link.stop()


def test_disable_nagle_says_when_there_is_no_socket() -> None:
    client = paho.Client(callback_api_version=CallbackAPIVersion.VERSION2, client_id="unconnected")
    assert disable_nagle(client) is False
