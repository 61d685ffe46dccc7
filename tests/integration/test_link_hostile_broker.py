"""A broker that sends bytes no MQTT broker should: the link drops what it cannot read, reconnects, and goes on.

Mosquitto never sends a PUBLISH with unreadable properties or a topic that is not UTF-8, so a small TCP server
plays the broker here: it answers each CONNECT with a CONNACK and then sends what the test scripts for that
connection. Before, an unreadable property ended the link's network thread (an exception out of paho's loop)
and a non-UTF-8 topic did the same in the link's own callback, both leaving the link saying it was connected.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest

from protocol.transport.mqtt import BrokerAddress, MqttLink

pytestmark = pytest.mark.integration

CONNACK_V5 = b"\x20\x03\x00\x00\x00"  # session not present, success, no properties


def _publish_v5(topic: bytes, payload: bytes, properties: bytes = b"") -> bytes:
    body = len(topic).to_bytes(2, "big") + topic + bytes([len(properties)]) + properties + payload
    assert len(body) < 128
    return bytes([0x30, len(body)]) + body


class ScriptedBroker:
    """Accepts connections on a free port; the n-th gets a CONNACK, then ``scripts[n]``'s packets."""

    def __init__(self, scripts: list[list[bytes]]) -> None:
        self.scripts = scripts
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", 0))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._open: list[socket.socket] = []
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self._server.getsockname()[1]}"

    def __enter__(self) -> ScriptedBroker:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)
        for conn in self._open:
            conn.close()
        self._server.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self._open.append(conn)
            conn.recv(65536)  # the CONNECT (small, in one segment on loopback)
            conn.sendall(CONNACK_V5)
            script = self.scripts[min(self.connections, len(self.scripts) - 1)]
            self.connections += 1
            for packet in script:
                conn.sendall(packet)


def test_the_link_drops_unreadable_packets_and_reconnects() -> None:
    got: list[tuple[str, bytes, bool]] = []
    scripts = [
        [_publish_v5(b"t/first", b"x", properties=b"\x7f\x00")],  # an unknown property id: a protocol error
        [_publish_v5(b"t/\xff\xfe", b"y"), _publish_v5(b"t/ok", b"fine")],  # a topic that is not UTF-8, then a good one
        [],
    ]
    with ScriptedBroker(scripts) as broker:
        link = MqttLink("hostile-broker", BrokerAddress.parse(broker.url), lambda *m: got.append(m))
        link.start()
        try:
            deadline = time.monotonic() + 60
            while not got and time.monotonic() < deadline and link._thread.is_alive():
                time.sleep(0.02)
            assert got == [("t/ok", b"fine", False)], (got, broker.connections, link._thread.is_alive())
            assert broker.connections >= 2  # the protocol error dropped the first connection; the link came back
            assert link._thread.is_alive() and link.connected
        finally:
            link.stop()


def test_a_failure_inside_the_network_loop_reconnects_instead_of_ending_the_thread() -> None:
    """An exception out of paho's loop (here the owner's handler fails on one message: a bug, which it would be)
    is logged and the link reconnects, rather than its thread ending while it still says it is connected."""
    got: list[str] = []

    def handler(topic: str, payload: bytes, retained: bool) -> None:
        if topic == "t/boom":
            raise RuntimeError("the owner's bug")
        got.append(topic)

    with ScriptedBroker([[_publish_v5(b"t/boom", b"x")], [_publish_v5(b"t/ok", b"fine")], []]) as broker:
        link = MqttLink("failing-owner", BrokerAddress.parse(broker.url), handler)
        link.start()
        try:
            deadline = time.monotonic() + 60
            while not got and time.monotonic() < deadline and link._thread.is_alive():
                time.sleep(0.02)
            assert got == ["t/ok"], (got, broker.connections, link._thread.is_alive())
            assert link._thread.is_alive() and broker.connections >= 2
        finally:
            link.stop()
