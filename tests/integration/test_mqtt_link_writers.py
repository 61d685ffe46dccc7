"""One writer per socket: large messages published from several threads at once arrive intact.

paho writes to the socket from the publishing thread unless something else owns the writes;
with the link's network thread reading and acknowledging at the same time, the bytes of two
large messages used to interleave (Mosquitto then cut the client off for a protocol error, or
delivered messages of the right length that did not decode). Every message here carries the
digest of its body, and a second link checks each one through a real Mosquitto.
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from pathlib import Path

import pytest

from launcher.broker import MosquittoBroker
from protocol.transport.mqtt import BrokerAddress, MqttLink, Will

pytestmark = pytest.mark.integration

THREADS = 4
MESSAGES_PER_THREAD = 3
BODY_BYTES = 8 * 1024 * 1024
"""Far larger than a socket buffer: every publish takes many partial writes."""
TIMEOUT_S = 120.0
PROBE = "writers/probe"


class Inbox:
    """What the receiving link got: topic -> payload; ``complete`` once every large one is in."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.payloads: dict[str, bytes] = {}
        self.lock = threading.Lock()
        self.probe_heard = threading.Event()
        self.complete = threading.Event()

    def __call__(self, topic: str, payload: bytes, retained: bool) -> None:
        if topic == PROBE:
            self.probe_heard.set()
            return
        with self.lock:
            self.payloads[topic] = bytes(payload)
            if len(self.payloads) >= self.expected:
                self.complete.set()


def _message(thread: int, index: int) -> bytes:
    body = os.urandom(BODY_BYTES - 32 - 64) + f"{thread:032d}{index:032d}".encode()
    return hashlib.sha256(body).digest() + body


def test_large_messages_from_several_threads_arrive_intact(tmp_path: Path) -> None:
    total = THREADS * MESSAGES_PER_THREAD
    inbox = Inbox(total)
    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = MqttLink("receiver", address, inbox, subscriptions=[("writers/#", 1)])
        sender = MqttLink("sender", address, lambda *_: None)
        receiver.start()
        sender.start()
        try:
            # The receiver subscribes in on_connect: once it hears a probe, the subscription is active.
            for _ in range(120):
                sender.publish(PROBE, b"probe", qos=1)
                if inbox.probe_heard.wait(0.5):
                    break
            assert inbox.probe_heard.is_set(), "the receiver never heard the probe"
            start = threading.Barrier(THREADS)

            def publish_from_thread(thread: int) -> None:
                start.wait()
                for index in range(MESSAGES_PER_THREAD):
                    sender.publish(f"writers/{thread}/{index}", _message(thread, index), qos=1)

            workers = [threading.Thread(target=publish_from_thread, args=(t,)) for t in range(THREADS)]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join(TIMEOUT_S)
            assert inbox.complete.wait(TIMEOUT_S), f"{len(inbox.payloads)} of {total} messages arrived"
            assert sender.connected, "the broker cut the sender off (a corrupted packet)"
        finally:
            sender.stop()
            receiver.stop()
        broker_log = broker.log_path.read_text(errors="replace")
    corrupted = [topic for topic, payload in inbox.payloads.items()
                 if len(payload) != BODY_BYTES or hashlib.sha256(payload[32:]).digest() != payload[:32]]
    assert not corrupted, f"{len(corrupted)} of {total} messages arrived corrupted: {sorted(corrupted)}"
    expected_topics = {f"writers/{t}/{i}" for t in range(THREADS) for i in range(MESSAGES_PER_THREAD)}
    assert set(inbox.payloads) == expected_topics
    assert "protocol error" not in broker_log.lower(), broker_log


def test_a_publish_while_the_link_connects_goes_out_after_connect(tmp_path: Path) -> None:
    """Between paho giving the client its new socket and queuing CONNECT, a publish from another thread
    used to queue its PUBLISH first; the broker closes a connection that does not start with CONNECT, and
    the link reconnected after a back-off. Publishers now wait while the link connects. paho's socket-open
    hook runs inside that window (the socket is the client's, CONNECT not yet queued): a publish started
    there must wait, and go out on the first connection."""
    heard: list[str] = []
    arrived = threading.Event()
    window: list[bool] = []
    publishers: list[threading.Thread] = []

    def on_message(topic: str, payload: bytes, retained: bool) -> None:
        heard.append(topic)
        arrived.set()

    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = MqttLink("receiver", address, on_message, subscriptions=[("window/#", 1)])
        receiver.start()
        assert receiver.wait_connected(30)
        sender = MqttLink("sender", address, lambda *_: None)

        def in_the_window(client: object, userdata: object, sock: object) -> None:
            window.append(sender._client_lock.locked())  # publishers are held back here
            publisher = threading.Thread(target=sender.publish, args=("window/early", b"x"))
            publishers.append(publisher)
            publisher.start()

        sender._client.on_socket_open = in_the_window
        sender.start()
        try:
            assert sender.wait_connected(30)
            # The receiver subscribed in on_connect before sender existed: the message can only be lost
            # if the sender's connection was refused.
            assert arrived.wait(TIMEOUT_S), "the publish made while connecting never arrived"
            assert sender.connects == 1, "the broker closed the sender's first connection"
        finally:
            for publisher in publishers:
                publisher.join(TIMEOUT_S)
            sender.stop()
            receiver.stop()
        broker_log = broker.log_path.read_text(errors="replace")
    assert window == [True]
    assert heard == ["window/early"]
    assert "protocol error" not in broker_log.lower(), broker_log


def test_a_link_that_stops_right_after_publishing_disconnects_cleanly(tmp_path: Path) -> None:
    """Every message published before ``stop`` is acknowledged before the DISCONNECT goes out.

    Closing with acknowledgements still unread made the kernel reset the connection: Mosquitto
    logged the client as disconnected "due to out of memory", sent its last will (a coordinator
    that had just said "finished" then looked offline) and could lose its last messages.
    """
    links = 20
    heard: list[str] = []
    with MosquittoBroker(workdir=tmp_path / "broker") as broker:
        address = BrokerAddress.parse(broker.url)
        receiver = MqttLink("receiver", address, lambda topic, payload, retained: heard.append(topic),
                            subscriptions=[("stops/#", 1)])
        receiver.start()
        try:
            for i in range(links):
                link = MqttLink(f"stopper-{i}", address, lambda *_: None, will=Will("stops/will", b"gone"))
                link.start()
                assert link.wait_connected(30), "the link did not connect"
                link.publish("stops/state", os.urandom(64 * 1024), retain=True)
                link.publish(f"stops/final/{i}", b"finished", retain=True)
                link.stop()

            def disconnects() -> list[str]:
                return [line for line in broker.log_path.read_text(errors="replace").splitlines()
                        if "Client stopper-" in line and "disconnected" in line]

            finals = {f"stops/final/{i}" for i in range(links)}
            deadline = time.monotonic() + TIMEOUT_S
            # Wait for both: the broker logs the last DISCONNECT before it forwards that client's message.
            while (len(disconnects()) < links or not finals <= set(heard)) and time.monotonic() < deadline:
                time.sleep(0.05)
            assert len(disconnects()) == links, disconnects()
        finally:
            receiver.stop()
    unclean = [line for line in disconnects() if "due to" in line]
    assert not unclean, unclean
    assert "stops/will" not in heard
    assert {t for t in heard if t.startswith("stops/final/")} == finals
